"""What the screenshot scripts share: run the Qt event loop until something holds."""

from __future__ import annotations

import time
from typing import Any, Callable

from PySide6.QtCore import QEventLoop
from PySide6.QtWidgets import QApplication


def wait_until(pred: Callable[[], bool], timeout: float = 900.0) -> None:
    """Process events until `pred()` is true; TimeoutError after `timeout` seconds."""
    app = QApplication.instance()
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError("timed out waiting for the app")
        app.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 50)
        time.sleep(0.01)


def settle(seconds: float = 0.3) -> None:
    """Process events for `seconds`: layouts and heights settle before a grab."""
    app = QApplication.instance()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        app.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 50)
        time.sleep(0.01)


def ready_window(model: str, sampler: Any, theme: str = "light", data_dir: Any = None) -> tuple[Any, list[str]]:
    """A main window on `model` in a throw-away data dir (or `data_dir`: a restart), the model
    loaded and `sampler` (a fixed seed) applied, and the list its error messages collect in.
    RuntimeError (naming the model) when the model cannot load."""
    import tempfile
    from pathlib import Path

    from app import build_main_window
    from app.core.store import ChatSettings

    folder = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="verbatim-shots-"))
    w = build_main_window(model, folder, theme=theme)
    errors: list[str] = []
    w.chat.notices.error_raised.connect(lambda title, text: errors.append(text))
    wait_until(lambda: w.chat.link.ready or bool(errors))
    if not w.chat.link.ready:
        raise RuntimeError(f"cannot load {model}: {errors[-1]}")
    w.settings.apply(ChatSettings(sampler=sampler, random_seed=False))
    return w, errors
