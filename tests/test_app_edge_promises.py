"""Promises of the chat around the cache core (issue 22): a regenerate repeats the reply's own
mode whatever the Settings say now, and "identical to an existing variant" needs bit-equal
logprobs, not only equal tokens. Checked through the window's actions and object names, and
through the chat logic's public calls (ChatSession), with a tiny real model.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from app.core.session import ChatSession, ChatSettings
from app.core.store import ConversationStore
from engine.engine import Engine
from engine.types import SamplerSettings
from tests.test_app_window import open_window, replies, send, wait_idle  # noqa: F401 (open_window: a fixture)
from tests.test_edge_promises import flip_low_bit


@pytest.fixture
def chat(tiny_model: Path, tmp_path: Path) -> Iterator[tuple[ChatSession, Engine]]:
    store = ConversationStore(tmp_path / "db.sqlite3")
    engine = Engine(use_disk=False, chunk=16)
    engine.load(str(tiny_model))
    yield ChatSession(store), engine
    engine.close()
    store.close()


def settings(mode: str) -> ChatSettings:
    return ChatSettings(sampler=SamplerSettings(temperature=0.9, max_tokens=12, seed=11), random_seed=False, mode=mode)


# -- mutation "identical variant decided on tokens alone" --------------------------------------------


def test_a_regenerate_with_equal_tokens_but_other_logprobs_is_kept_as_a_variant(chat) -> None:
    session, engine = chat
    conv = session.new_conversation(settings("exact"))
    p1 = session.begin_send(conv, "Why is the sky blue?")
    first = session.finish(p1, engine.generate(p1.request))
    p2 = session.begin_regenerate(first.id)
    result = engine.generate(p2.request)
    assert (result.tokens, result.logprobs) == (first.tokens, first.logprobs)  # the real regenerate: identical
    k = 3
    lps = list(result.logprobs)
    lps[k] = flip_low_bit(lps[k])  # the same tokens, one logprob one float32 ulp away
    reply = session.finish(p2, dataclasses.replace(result, logprobs=lps))
    assert p2.duplicate_of is None and reply.id != first.id
    stored = session.store.get_message(reply.id)
    assert stored.tokens == first.tokens and stored.logprobs == lps and stored.status == "complete"
    assert p2.outcome.comparison.identical is False and p2.outcome.comparison.first_diff is None
    assert [m.id for m in session.store.siblings(first.id)] == [first.id, reply.id]
    assert session.view(conv)[-1].navigator == "2 / 2"


# -- mutation "regenerate uses the Settings' mode" -------------------------------------------------


@pytest.mark.parametrize("made, now", [("exact", "fast"), ("fast", "exact")])
def test_regenerate_repeats_the_replys_mode_whatever_the_settings_say(chat, made: str, now: str) -> None:
    session, engine = chat
    conv = session.new_conversation(settings(made))
    p1 = session.begin_send(conv, "The capital of France is")
    first = session.finish(p1, engine.generate(p1.request))
    assert first.report.mode == made
    session.set_settings(conv, settings(now))
    pending = session.begin_regenerate(first.id)
    assert pending.request.mode == made
    result = engine.generate(pending.request)
    assert result.report.mode == made and result.tokens == first.tokens
    variant = session.begin_regenerate(first.id, fresh=True)  # a new variant takes the Settings as they are
    assert variant.request.mode == now


@pytest.mark.gui
def test_window_regenerate_runs_in_the_replys_mode_after_settings_changed(qtbot: Any, open_window: Callable) -> None:
    from PySide6.QtGui import QAction

    w = open_window()  # exact mode
    send(qtbot, w, "The capital of France is")
    first = replies(w)[-1]
    assert w.session.store.get_message(first.id).cache_report["mode"] == "exact"
    w.apply_settings(dataclasses.replace(w.current_settings(), mode="fast"))
    assert "fast" in w.settings_summary.text()
    w.findChild(QAction, "debugAction").trigger()
    w.findChild(QAction, "regenerateAction").trigger()
    assert w.chat.generating
    wait_idle(qtbot, w)
    assert w.debug_panel.value("mode") == "exact"  # the run's own report, shown for the reply it matched
    assert replies(w)[-1].id == first.id  # identical: no copy added
    assert "fast" in w.settings_summary.text()  # the Settings stay as the user set them
