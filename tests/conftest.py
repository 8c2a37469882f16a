"""Shared test setup. Keep minimal: the engine and GUI tests both use it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# GUI tests run headless; set before anything imports Qt.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight llama folder (engine.tiny), built once per session."""
    from engine.tiny import build_model

    return build_model(tmp_path_factory.mktemp("models") / "llama", family="llama")
