"""Shared test setup. Keep minimal: the engine and GUI tests both use it."""

from __future__ import annotations

import atexit
import gc
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterator

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
    """A tiny random-weight llama folder (tests/tiny_models.py), built once per session."""
    from tests.tiny_models import build_model

    return build_model(tmp_path_factory.mktemp("models") / "llama", family="llama")


class GcLog(list[tuple[int, str, bool]]):
    """Collections as (generation, thread name, flag): flag is what `flag()` returned then."""

    def flag(self) -> bool:
        return False


@pytest.fixture
def gc_collections() -> Iterator[GcLog]:
    """Every cyclic-GC collection that starts during the test; GC settings restored after."""
    seen = GcLog()

    def cb(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append((info["generation"], threading.current_thread().name, bool(seen.flag())))

    enabled, threshold = gc.isenabled(), gc.get_threshold()
    gc.collect()
    gc.callbacks.append(cb)
    try:
        yield seen
    finally:
        gc.callbacks.remove(cb)
        gc.set_threshold(*threshold)
        (gc.enable if enabled else gc.disable)()
