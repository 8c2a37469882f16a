"""The process's memory, told and bounded from the app (issue 50, item 7), without Qt: the engine
link reads Engine.memory_report after every run (`memory_changed`), and the memory tier's budget
the user sets is applied at once on the engine thread, and again after a load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.core import ops
from app.core.chat import Chat
from app.core.engine_link.memory_text import memory_now_text, memory_split_text
from engine.memory import MIB, default_memory_budget
from tests.app.chat_helpers import load, wait_for

PROMPT = "Why is the sky blue? Because of Rayleigh scattering of sunlight. " * 20


def refreshed(chat: Chat) -> Any:
    """The memory as the link reads it after every engine job asked before (run in order)."""
    chat.jobs.loop.run_until_complete(chat.link.refresh_stats())
    return chat.link.memory_report


def test_the_memory_is_read_after_every_run_and_a_budget_applies_at_once_and_after_a_load(
    chat: Chat, tiny_model: Path
) -> None:
    link = chat.link
    told: list[str] = []  # in order: each reply's end, each read of the numbers (and the memory)
    chat.generation.finished.connect(lambda done: told.append("finished"))
    link.stats_changed.connect(lambda *args: told.append("read"))
    for i in range(3):
        ops.new_conversation(chat)
        ops.send(chat, f"Question {i}: {PROMPT}")
        wait_for(chat, chat.generation.finished)
        if told[-1] == "finished":  # read again after the run (it may have come already)
            wait_for(chat, link.stats_changed)
        report = link.memory_report
        assert report is not None and report.tier_entries >= i + 1
    full = link.memory_report
    assert full.tier_budget == default_memory_budget() and full.weights > 0 and full.tier > MIB
    assert memory_split_text(full).splitlines() == full.lines()
    assert memory_now_text(full) == f"Holds {full.tier / MIB:,.0f} MB now of {full.tier_budget / MIB:,.0f} MB ({full.tier_entries} snapshots)."

    link.set_memory_budget(MIB)  # smaller than what the tier holds: it evicts at once
    small = refreshed(chat)
    assert small.tier_budget == MIB and small.tier <= MIB and small.tier_entries < full.tier_entries
    load(chat, tiny_model)  # the engine's budget stays the one set
    assert refreshed(chat).tier_budget == MIB
    link.set_memory_budget(None)  # the default again
    back = refreshed(chat)
    assert back.tier_budget == default_memory_budget() and link.memory_budget is None


def test_attached_to_a_server_the_memory_is_the_servers() -> None:
    assert memory_split_text(None, remote=True) == "The memory that matters is the server's, in its own process."
    assert memory_now_text(None, remote=True).startswith("Attached to a server: ")
