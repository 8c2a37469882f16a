"""The GUI tests' fixtures: a real window on the tiny model (`open_window`), a 2-rank Verbatim
server (`cluster`). What the tests do with them is in driver.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from app import build_main_window  # noqa: E402
from app.qt.window.window import MainWindow  # noqa: E402
from tests.cluster import Cluster, running  # noqa: E402
from tests.gui.driver import LONG, settings, watch  # noqa: E402


@pytest.fixture
def open_window(qtbot: Any, tiny_model: Path, tmp_path: Path) -> Iterator[Callable[..., MainWindow]]:
    """Build a window on the tiny model (data dir under tmp_path) and wait for the model."""
    opened: list[MainWindow] = []

    def make(data_dir: Path | None = None, model: str | None = None, wait: bool = True,
             max_tokens: int = 24, temperature: float = 0.9, logit_bias: Any = (), **kw: Any) -> MainWindow:  # fmt: skip
        kw.setdefault("chunk", 16)
        w = build_main_window(model or str(tiny_model), data_dir or tmp_path / "data", **kw)
        qtbot.addWidget(w)
        opened.append(w)
        watch(w)  # what the chat model tells, from the start
        if wait:
            qtbot.waitUntil(lambda: w.chat.link.ready, timeout=LONG)
            w.activateWindow()  # window shortcuts (Esc, Ctrl+R, Ctrl+D) need the active window
            qtbot.waitUntil(w.isActiveWindow, timeout=LONG)
            w.settings.apply(settings(max_tokens, temperature, logit_bias))
        return w

    yield make
    for w in opened:
        w.close()


@pytest.fixture
def cluster(tiny_model: Path, tmp_path: Path) -> Iterator[Cluster]:
    """A Verbatim server on 2 ranks (ring backend on localhost) serving the tiny model."""
    with running(str(tiny_model), 2, tmp_path) as c:
        yield c
