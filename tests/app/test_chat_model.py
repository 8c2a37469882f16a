"""The chat model without Qt (app/core/chat.py): a plain asyncio loop, a real Engine on a tiny
model on its executor thread. What a window sees, a test sees the same way: by subscribing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from app.core import ops
from app.core.engine_link import flows
from app.core.chat import ChatModel
from app.core.session import ChatSession, ChatSettings
from app.core.store import ConversationStore
from engine.engine import Engine
from engine.executor import EngineExecutor
from engine.types import SamplerSettings

TIMEOUT = 60.0  # seconds: a safety net; every wait returns on the event it waits for


def settings(max_tokens: int = 24) -> ChatSettings:
    return ChatSettings(sampler=SamplerSettings(temperature=0.9, top_p=0.95, max_tokens=max_tokens, seed=5),
                        random_seed=False)


class Log:
    """Every event of the model, in order, as (name, args)."""

    def __init__(self, chat: ChatModel) -> None:
        self.events: list[tuple[str, tuple[Any, ...]]] = []
        for name in (ops.PATH, ops.SELECTED, ops.PENDING, ops.STREAM, ops.PREFILL, ops.FINISHED, ops.ERROR,
                     ops.DRAFT, ops.STATS):
            chat.subscribe(name, lambda *args, name=name: self.events.append((name, args)))

    def names(self) -> list[str]:
        return [n for n, _ in self.events]

    def of(self, name: str) -> list[tuple[Any, ...]]:
        return [a for n, a in self.events if n == name]


def wait_for(chat: ChatModel, event: str, when: Callable[..., bool] = lambda *a: True) -> tuple[Any, ...]:
    """Run the loop until `chat` emits `event` (with args `when` accepts); its args."""
    fut: asyncio.Future[tuple[Any, ...]] = chat.loop.create_future()

    def seen(*args: Any) -> None:
        if not fut.done() and when(*args):
            fut.set_result(args)

    stop = chat.subscribe(event, seen)
    try:
        return chat.loop.run_until_complete(asyncio.wait_for(fut, TIMEOUT))
    finally:
        stop()


def make_chat(tmp_path: Path, max_tokens: int = 24) -> ChatModel:
    loop = asyncio.new_event_loop()
    session = ChatSession(ConversationStore(tmp_path / "db.sqlite3"))
    executor = EngineExecutor(lambda: Engine(use_disk=False, chunk=16))
    return ChatModel(session, executor, loop, loop.create_task, lambda: settings(max_tokens), chunk=16,
                     batch_interval=0.02)


@pytest.fixture
def chat(tiny_model: Path, tmp_path: Path) -> Iterator[ChatModel]:
    c = make_chat(tmp_path)
    flows.load_model(c, str(tiny_model))
    wait_for(c, flows.MODEL, lambda what, *a: what in ("loaded", "failed"))
    assert c.model_ready
    yield c
    close(c)


def close(c: ChatModel) -> None:
    assert c.shutdown(TIMEOUT)
    c.loop.run_until_complete(asyncio.sleep(0))  # let the cancelled coroutines go
    c.session.close()
    c.loop.close()


def test_a_send_streams_in_batches_saves_and_selects_the_new_reply(chat: ChatModel) -> None:
    log = Log(chat)
    assert ops.send(chat, "Why is the sky blue?") and chat.generating
    pending = chat.pending
    assert [vm.role for vm in chat.vms] == ["user", "assistant"] and chat.selected.id == pending.reply_id
    _, result = wait_for(chat, ops.FINISHED)
    assert not chat.generating and log.of(ops.PENDING)[-1] == (None,)
    texts = [text for rid, text, n in log.of(ops.STREAM)]
    assert texts and all(a == b[: len(a)] for a, b in zip(texts, texts[1:])) and texts[-1] == result.text
    assert len(texts) < len(result.tokens)  # batches, not one update per token
    names = log.names()
    assert names.index(ops.PENDING) < names.index(ops.STREAM) < names.index(ops.FINISHED)
    reply = chat.vms[-1]
    stored = chat.session.message(reply.id)
    assert reply.id == pending.reply_id and stored.status == "complete" and stored.tokens == result.tokens
    assert stored.logprobs == result.logprobs and chat.selected.id == reply.id and len(reply.runs) == 1
    assert log.of(ops.SELECTED)[-1][0].id == reply.id


def test_regenerate_acts_on_the_selected_reply(chat: ChatModel) -> None:
    ops.send(chat, "The capital of France is")
    wait_for(chat, ops.FINISHED)
    first = chat.vms[-1].id
    ops.send(chat, "And of Italy?")
    wait_for(chat, ops.FINISHED)
    second = chat.vms[-1].id
    chat.open(chat.conv_id)  # reopened: nothing picked, the last reply is the selected one
    assert chat.selected_id is None and chat.selected.id == second
    chat.select(chat.vms[0].id)  # a user message: not a reply, ignored
    assert chat.selected.id == second
    chat.select(first)
    assert chat.selected.id == first
    assert ops.regenerate(chat)
    pending, result = wait_for(chat, ops.FINISHED)
    assert pending.previous_id == first and pending.duplicate_of == first  # identical: a run of it
    assert [vm.id for vm in chat.vms if vm.role == "assistant"] == [first, second]
    runs = next(vm for vm in chat.vms if vm.id == first).runs
    assert len(runs) == 2 and runs[-1].report.restored == result.report.prompt_tokens - 1
    assert chat.selected.id == first


def test_stop_mid_stream_ends_with_the_result_and_keeps_the_tokens(tmp_path: Path, tiny_model: Path) -> None:
    c = make_chat(tmp_path, max_tokens=3000)
    c.default_settings = lambda: ChatSettings(sampler=SamplerSettings(temperature=0.0, max_tokens=3000))
    flows.load_model(c, str(tiny_model))
    wait_for(c, flows.MODEL, lambda what, *a: what in ("loaded", "failed"))
    ops.send(c, "Tell me a long story.")
    wait_for(c, ops.STREAM)
    assert ops.stop(c)
    pending, result = wait_for(c, ops.FINISHED)
    stored = c.session.message(pending.reply_id)
    assert result.finish_reason == "cancelled" and 0 < len(result.tokens) < 3000
    assert stored.status == "interrupted" and stored.tokens == result.tokens and stored.content == result.text
    assert "stopped" in c.vms[-1].footer
    close(c)


def test_an_engine_error_is_told_and_the_message_kept(tmp_path: Path) -> None:
    c = make_chat(tmp_path)  # no model loaded
    log = Log(c)
    assert ops.send(c, "hello?")
    title, text = wait_for(c, ops.ERROR)
    assert title == "The reply could not be generated" and "no model loaded" in text
    assert not c.generating and [vm.role for vm in c.vms] == ["user"]  # the empty placeholder went
    assert ops.FINISHED not in log.names()
    close(c)


def test_the_draft_is_counted_off_the_loop_with_the_limit_in_force(chat: ChatModel) -> None:
    ops.send(chat, "hi")
    wait_for(chat, ops.FINISHED)
    chat.session.set_settings(chat.conv_id, ChatSettings(context_length=1000))
    text = "a longer draft, typed on"
    chat.set_draft("a first")
    chat.set_draft(text)  # debounced: only this one is counted
    (budget,) = wait_for(chat, ops.DRAFT, lambda b: b is not None and b.draft > 0)
    messages = chat.session.draft_messages(chat.conv_id, text, chat.settings())
    expected = chat.executor.submit(lambda e: len(e.prompt_ids(messages))).result(TIMEOUT)
    alone = chat.executor.submit(lambda e: len(e.prompt_ids(messages[-1:]))).result(TIMEOUT)
    assert budget.used == expected and budget.limit == 1000 and budget.draft == alone
    assert chat.budget is budget and budget.fits and budget.warning == ""
    assert messages[-1] == {"role": "user", "content": text} and messages[-2]["role"] == "assistant"
