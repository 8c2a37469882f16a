"""Background tasks that do not touch MLX (model discovery, downloads): one plain thread each.

MLX work goes to the engine worker instead (streams are thread-local). A task reports
progress, can be cancelled, and ends with exactly one of `done` / `failed` (queued to the GUI).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional

from PySide6.QtCore import QObject, Signal

from app.qt.worker import is_cancelled_error, user_message
from engine.types import CancelToken

log = logging.getLogger(__name__)


class BackgroundTask(QObject):
    progress = Signal(float, str)
    done = Signal(object)
    failed = Signal(str)  # "cancelled" when cancelled

    def __init__(self, fn: Callable[..., Any], with_progress: bool = True, parent: Optional[QObject] = None) -> None:
        super().__init__(parent)
        self._fn = fn
        self._with_progress = with_progress
        self.cancel_token = CancelToken()
        self._last = 0.0
        self._thread = threading.Thread(target=self._run, name="verbatim-task", daemon=True)

    def start(self) -> "BackgroundTask":
        self._thread.start()
        return self

    def cancel(self) -> None:
        self.cancel_token.cancel()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def wait(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _report(self, fraction: float, message: str) -> None:
        now = time.perf_counter()
        if now - self._last >= 0.05 or fraction >= 1.0:  # at most ~20 updates a second
            self._last = now
            self.progress.emit(float(fraction), str(message))

    def _run(self) -> None:
        try:
            out = self._fn(self._report, self.cancel_token) if self._with_progress else self._fn()
        except Exception as e:
            if not is_cancelled_error(e):
                log.info("background task failed: %s", e)
            self.failed.emit("cancelled" if is_cancelled_error(e) or self.cancel_token.cancelled else user_message(e))
            return
        if self.cancel_token.cancelled:
            self.failed.emit("cancelled")
        else:
            self.done.emit(out)
