"""The Qt-free app tests' fixtures: the chat logic over a real store and a real Engine on the
tiny model (`session_engine`)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from app.core.store.session import ChatSession
from app.core.store import ConversationStore
from engine.engine import Engine


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
