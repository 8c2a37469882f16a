"""Shared test setup. Keep minimal: the engine and GUI tests both use it."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# GUI tests run headless; set before anything imports Qt.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Never touch the user's cache (prompt cache, imported models, weight-hash memo): one throwaway
# root for the session, inherited by the CLI subprocesses the tests start.
_CACHE_ROOT = tempfile.mkdtemp(prefix="verbatim-test-cache-")
os.environ["VERBATIM_CACHE_DIR"] = _CACHE_ROOT
atexit.register(shutil.rmtree, _CACHE_ROOT, True)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight llama folder (engine.tiny), built once per session."""
    from engine.tiny import build_model

    return build_model(tmp_path_factory.mktemp("models") / "llama", family="llama")
