"""Shared test setup, and the fixtures tests of several areas use: the tiny models (by cache
family, the llama alone, the tool model) and the session's throwaway cache and keyring. Each
area's own fixtures are in its conftest.py (tests/engine, tests/cache, tests/serve, tests/app,
tests/gui); what tests share besides fixtures is in the helper modules beside this file, whose
names do not start with `test_` (tests/project/test_test_module_imports.py checks that no test module
imports another)."""

from __future__ import annotations

import atexit
import gc
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

# The helpers' asserts report their values as a test's own do.
pytest.register_assert_rewrite("tests.disk_helpers", "tests.engine_helpers", "tests.server_helpers")

# GUI tests run headless; set before anything imports Qt.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Never touch the user's cache (prompt cache, imported models, weight-hash memo): one throwaway
# root for the session, inherited by the CLI subprocesses the tests start.
_CACHE_ROOT = tempfile.mkdtemp(prefix="verbatim-test-cache-")
os.environ["VERBATIM_CACHE_DIR"] = _CACHE_ROOT
atexit.register(shutil.rmtree, _CACHE_ROOT, True)

# Nor the user's keyring (macOS Keychain, Secret Service): API keys a window remembers go to a
# JSON file in that throwaway root (tests/file_keyring.py); `file_keyring` gives a test its own.
import keyring  # noqa: E402

from tests.file_keyring import FileKeyring  # noqa: E402

_SESSION_KEYRING = FileKeyring(Path(_CACHE_ROOT) / "keyring.json")
keyring.set_keyring(_SESSION_KEYRING)


@pytest.fixture
def file_keyring(tmp_path: Path) -> Iterator[FileKeyring]:
    """This test's own file-backed keyring (tmp_path/keyring.json), the session's one after."""
    kr = FileKeyring(tmp_path / "keyring.json")
    keyring.set_keyring(kr)
    try:
        yield kr
    finally:
        keyring.set_keyring(_SESSION_KEYRING)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`mac_only` / `linux_only` (pyproject markers): skipped on the other platform, saying why."""
    for item in items:
        if item.get_closest_marker("mac_only") and sys.platform != "darwin":
            item.add_marker(pytest.mark.skip(reason="mac_only: needs macOS (Metal, Accelerate, the Keychain)"))
        if item.get_closest_marker("linux_only") and not sys.platform.startswith("linux"):
            item.add_marker(pytest.mark.skip(reason="linux_only: a Linux mechanism (OpenBLAS preload, Xvfb, tmpfs, nice)"))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight llama folder (tests/tiny_models.py), built once per session."""
    from tests.tiny_models import build_model

    return build_model(tmp_path_factory.mktemp("models") / "llama", family="llama")


class TinyModels:
    """Tiny random-weight models by cache family (tests/tiny_models.py: FAMILIES), each built in
    its own folder (ROOT/<family>) the first time a test asks for it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._built: dict[str, Path] = {}

    def __getitem__(self, family: str) -> Path:
        from tests.tiny_models import build_model

        if family not in self._built:
            self._built[family] = build_model(self.root / family, family)
        return self._built[family]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    """This module's tiny models by family: `models["gemma3"]` builds it on first use."""
    return TinyModels(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def llama(models: TinyModels) -> Path:
    """This module's own tiny llama, in its folder (the session's `tiny_model` is one for every module)."""
    return models["llama"]


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2 with a Qwen-style tools template (tests/tiny_models.py: build_tool_model)."""
    from tests.tiny_models import build_tool_model

    return build_tool_model(tmp_path_factory.mktemp("models") / "qwen-tools")


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
