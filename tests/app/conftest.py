"""The Qt-free app tests' fixtures: the chat logic over a real store and a real Engine on the
tiny model (`session_engine`), and a whole Chat with the tiny model loaded (`chat`:
tests/app/chat_helpers.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from app.core.chat import Chat
from app.core.store.session import ChatSession
from app.core.store import ConversationStore
from engine.engine import Engine
from tests.app.chat_helpers import close, load, make_chat


@pytest.fixture
def session_engine(tiny_model: Path, tmp_path: Path) -> Iterator[tuple[ChatSession, Engine]]:
    """A ChatSession on a fresh store (tmp_path/db.sqlite3) and an Engine with the tiny model
    loaded (memory cache only, chunk 16)."""
    store = ConversationStore(tmp_path / "db.sqlite3")
    engine = Engine(use_disk=False, chunk=16)
    engine.load(str(tiny_model))
    yield ChatSession(store), engine
    engine.close()
    store.close()


@pytest.fixture
def chat(tiny_model: Path, tmp_path: Path) -> Iterator[Chat]:
    """A Chat on a fresh store with the tiny model loaded; shut down after the test."""
    c = make_chat(tmp_path)
    load(c, tiny_model)
    yield c
    close(c)
