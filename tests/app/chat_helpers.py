"""The chat without Qt, as the app's tests drive it: a Chat on a plain asyncio loop over a real
store and a real Engine (tiny model, chunk 16) on its executor thread; waiting on a sub-model's
signal by running the loop until it comes (never a sleep). The `chat` fixture (tests/app/
conftest.py) is one of these with the tiny model loaded."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Callable, Optional

from app.core.chat import Chat
from app.core.store import ChatSettings, ConversationStore
from app.core.store.session import ChatSession
from engine.engine import Engine
from engine.executor import EngineExecutor
from engine.types import SamplerSettings

TIMEOUT = 60.0  # seconds: a safety net; every wait returns on the event it waits for


def settings(max_tokens: int = 24) -> ChatSettings:
    return ChatSettings(sampler=SamplerSettings(temperature=0.9, top_p=0.95, max_tokens=max_tokens, seed=5),
                        random_seed=False)


def wait_for(chat: Chat, signal: Any, when: Callable[..., bool] = lambda *a: True) -> tuple[Any, ...]:
    """Run the loop until `signal` (one of `chat`'s sub-models') is emitted with args `when`
    accepts; its args."""
    fut: asyncio.Future[tuple[Any, ...]] = chat.jobs.loop.create_future()

    def seen(*args: Any) -> None:
        if not fut.done() and when(*args):
            fut.set_result(args)

    signal.connect(seen)
    try:
        return chat.jobs.loop.run_until_complete(asyncio.wait_for(fut, TIMEOUT))
    finally:
        signal.disconnect(seen)


def make_chat(tmp_path: Path, defaults: Optional[ChatSettings] = None) -> Chat:
    loop = asyncio.new_event_loop()
    session = ChatSession(ConversationStore(tmp_path / "db.sqlite3"))
    executor = EngineExecutor(lambda: Engine(use_disk=False, chunk=16))
    return Chat(session, executor, loop, loop.create_task, lambda: defaults or settings(), chunk=16,
                batch_interval=0.02)


def load(c: Chat, model: Path) -> None:
    c.link.load(str(model))
    wait_for(c, c.link.loaded)
    assert c.link.ready


def close(c: Chat) -> None:
    assert c.shutdown(TIMEOUT)
    c.jobs.loop.run_until_complete(asyncio.sleep(0))  # let the cancelled coroutines go
    c.session.close()
    c.jobs.loop.close()
