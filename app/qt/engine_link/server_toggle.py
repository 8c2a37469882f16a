"""The window's "Local server" toggle: the loaded model over an OpenAI-compatible HTTP API.

The server (engine/serve) runs on the app's asyncio loop (qasync: the Qt event loop), and every
request goes through the window's engine worker like the window's own replies: one thread runs
MLX, the requests queue behind (and between) the window's work, and the window stays
responsive. A status bar label shows the URL and the queue; the action's check mark shows
whether the server is on. Loopback only, so no API key (engine/serve/server.py).

API clients have a prompt cache of their own: they never restore (nor learn anything about) the
window's conversations, unless the user turns on "Share this window's cache with API clients"
(`share_action`, off by default).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Optional

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QLabel, QWidget

from engine.serve import DEFAULT_HOST, DEFAULT_PORT
from engine.serve.schema import ServedModel

if TYPE_CHECKING:
    from engine.serve.server import ServerHandle

log = logging.getLogger(__name__)


class ServerToggle(QObject):
    started = Signal(str)  # URL
    stopped = Signal()
    failed = Signal(str)  # message

    def __init__(self, executor: Any, parent: QWidget, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                 seed: Callable[[], Optional[int]] = lambda: None) -> None:  # fmt: skip
        super().__init__(parent)
        self.executor = executor  # anything with submit(fn) -> Future of fn(engine) on the engine thread
        self.seed = seed  # the seed of a request that names none, read at each start (`engine serve --seed`)
        self.host, self.port = host, port
        self.handle: Optional["ServerHandle"] = None
        self.model: Optional[ServedModel] = None
        self._task: Optional[asyncio.Task[Any]] = None
        self.action = QAction("Local server", parent, checkable=True)
        self.action.setObjectName("localServerAction")
        self.action.setToolTip("Serve the loaded model over an OpenAI-compatible API on this computer")
        self.action.toggled.connect(self._toggled)
        self.share_action = QAction("Share this window's cache with API clients", parent, checkable=True)
        self.share_action.setObjectName("shareCacheAction")
        self.share_action.setToolTip(
            "Off (the default): programs using the local server have a prompt cache of their own and can "
            "neither reuse nor detect this window's conversations. On: they reuse the window's cached "
            "conversations (faster when they send the same text), which lets a program on this computer "
            "find out what the window's conversations contain.")
        self.share_action.toggled.connect(self._share_toggled)
        self.label = QLabel()
        self.label.setObjectName("statusServer")
        self.label.setVisible(False)

    @property
    def url(self) -> Optional[str]:
        return self.handle.url if self.handle is not None and self.handle.running else None

    def set_model(self, info: Any, spec: Optional[str] = None, chunk: Optional[int] = None,
                  template_reads: tuple[str, ...] = ()) -> None:  # fmt: skip
        """The window loaded a model (or lost it: None); the server serves it from now on, as
        `engine serve` would (its chunk, and the request options its chat template reads)."""
        self.model = (replace(ServedModel.of(info, spec), chunk=chunk, template_reads=template_reads)
                      if info is not None else None)  # fmt: skip
        if self.handle is not None:
            self.handle.set_model(self.model)
        self._show()

    # -- on / off ----------------------------------------------------------------------------------
    def _toggled(self, on: bool) -> None:
        if on and self.handle is None:
            self._task = asyncio.ensure_future(self._start())
        elif not on and self.handle is not None:
            self._task = asyncio.ensure_future(self._stop())

    async def _start(self) -> None:
        from engine.serve.server import (  # aiohttp: only once asked for
            ServeError,
            ServerHandle,
        )

        try:
            self.handle = ServerHandle(self.executor, self.model, self.host, self.port,
                                       share_window_cache=self.share_action.isChecked(), seed=self.seed())
            self.handle.state.subscribe(lambda _state: self._show())
            url = await self.handle.start()
        except (ServeError, OSError) as e:
            self.handle = None
            self.action.setChecked(False)
            self._show()
            self.failed.emit(str(e))
            return
        self._show()
        self.started.emit(url)

    def _share_toggled(self, on: bool) -> None:
        if self.handle is not None:
            self.handle.set_share_window_cache(on)

    async def _stop(self) -> None:
        handle, self.handle = self.handle, None
        if handle is not None:
            await handle.stop()
        self._show()
        self.stopped.emit()

    def shutdown(self) -> None:
        """The window closes: stop every request's generation now; the rest of the stop (closing
        connections, unbinding) runs on the loop, see `wait_stopped`."""
        if self.handle is not None:
            self.handle.state.cancel_all()
            self.action.blockSignals(True)
            self.action.setChecked(False)
            self.action.blockSignals(False)
            self._task = asyncio.ensure_future(self._stop())

    async def wait_stopped(self) -> None:
        """Until the last start or stop has finished (the app awaits this before its loop ends)."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    def _show(self) -> None:
        h = self.handle
        if h is None or not h.running:
            self.label.setVisible(False)
            return
        q = h.state
        busy = q.waiting + q.running
        text = f"Server: {h.url}" + (f" · {busy} request{'s' if busy != 1 else ''}" if busy else "")
        if self.model is None:
            text += " · no model"
        self.label.setText(text)
        self.label.setToolTip(f"OpenAI-compatible API. Queue: {q.waiting} waiting, {q.running} running "
                              f"(at most {q.limit}); {q.served} served, {q.refused} refused.")
        self.label.setVisible(True)
