"""The engine tests' fixtures: `engine`, a fresh Engine on this module's tiny llama (memory cache
only, chunk 16) for each test. Engines on other models or settings are their modules' own
fixtures; shared models are in tests/conftest.py, shared helpers in tests/engine_helpers.py."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from engine.engine import Engine


@pytest.fixture
def engine(llama: Path) -> Iterator[Engine]:
    eng = Engine(use_disk=False, chunk=16)
    eng.load(str(llama))
    yield eng
    eng.close()
