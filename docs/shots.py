"""What the screenshot scripts share: run the Qt event loop until something holds."""

from __future__ import annotations

import time
from typing import Callable

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
