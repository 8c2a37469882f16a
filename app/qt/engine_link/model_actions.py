"""The window's model controls: the model picker and the label beside it, the status bar's load
progress, model name and memory readout, the model folders setting, the model manager, the local
server toggle, and the window attached to a Verbatim server (connect, disconnect, where the model
runs and whether it answers). Bound to the engine link (app/core/engine_link/model.py); a load or
a connection is its intent. What the window remembers (the last model, the model folders, a
server's key) lives in its settings.ini.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Optional

import psutil
from PySide6.QtCore import QObject, QSettings, Qt, QTimer
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QLabel, QProgressBar, QStatusBar, QWidget

from app.core.chat import Chat
from app.core.conversation.view_models import format_bytes
from app.core.engine_link import api_keys
from app.core.engine_link.model import ServerLink
from app.core.engine_link.models import model_label
from app.qt import jobs
from app.qt.engine_link.model_picker import ModelPicker
from app.qt.engine_link.server_toggle import ServerToggle
from app.qt.widgets.elided_label import ElidedLabel
from engine.engine import ModelInfo

log = logging.getLogger(__name__)
MEMORY_MS = 2000  # the memory readout is read again this often

_process = psutil.Process()


def load_step_text(fraction: float, message: str) -> str:
    """The label beside the picker during a load: the step and how far it is. A step's end is not
    the load's (an import's "done" comes before the weights are read): it says loading until the
    model is loaded, and never "100%"."""
    if fraction < 1:
        return f"{message} {fraction:.0%}"
    return "loading…" if message in ("", "done") else f"{message} · loading…"


class ModelControls(QObject):
    def __init__(self, chat: Chat, window: QWidget, qsettings: QSettings, picker: ModelPicker,
                 model_status: ElidedLabel, status_bar: QStatusBar) -> None:  # fmt: skip
        super().__init__(window)
        self.chat, self.window, self.qsettings = chat, window, qsettings
        self.picker, self.model_status = picker, model_status
        self.discovery: Optional[Any] = None  # the model discovery under way
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setMaximumWidth(180)
        self.progress.setTextVisible(False)
        self.progress.setVisible(False)
        self.model_label = QLabel()
        self.model_label.setObjectName("statusModel")
        self.memory_label = QLabel()
        self.memory_label.setObjectName("statusMemory")
        for widget in (self.progress, self.model_label, self.memory_label):
            status_bar.addPermanentWidget(widget)
        # The local OpenAI-compatible server: the loaded model, through this window's worker.
        # A request that names no seed gets the one the settings give every new reply, if they do.
        self.server_toggle = ServerToggle(chat.jobs.executor, window,
                                          seed=lambda: chat.conversation.default_settings().fixed_seed)
        self.server_toggle.failed.connect(lambda msg: chat.notices.error("Cannot start the local server", msg))
        status_bar.addPermanentWidget(self.server_toggle.label)
        self.disconnect_action = QAction("Disconnect from the server", window)
        self.disconnect_action.setObjectName("disconnectServerAction")
        self.disconnect_action.setEnabled(False)
        self.disconnect_action.triggered.connect(self.disconnect)
        if not chat.read_only:  # a key an older version left in settings.ini moves to the keyring
            api_keys.migrate(qsettings)
        picker.chosen.connect(self.load)
        picker.manageRequested.connect(self.open_manager)
        link = chat.link
        link.loading.connect(self._loading)
        link.progress.connect(self._progress)  # a load's steps are few (a file's hash, a tensor converted)
        link.loaded.connect(self._loaded)
        link.failed.connect(self._failed)
        link.server_changed.connect(self._show_server)
        link.stats_changed.connect(lambda stats, memory: self.update_memory())
        link.models_found.connect(picker.show_models)
        self._memory = QTimer(self)
        self._memory.timeout.connect(self.update_memory)
        self._memory.start(MEMORY_MS)
        self.update_memory()

    # -- intents -----------------------------------------------------------------------------------
    def load(self, spec: str, name: Optional[str] = None) -> None:
        """Load a model, or attach to a Verbatim server (an http:// spec, with its remembered key)."""
        self.chat.link.load(spec, name or model_label(spec), api_key=self.server_key(spec))

    def server_key(self, url: str) -> Optional[str]:
        """The remembered API key of the server at `url`, if any (the keyring's: app/core/engine_link/api_keys.py)."""
        return api_keys.remembered_key(self.qsettings, url)

    def discover(self) -> None:
        self.discovery = jobs.spawn(self.chat.link.discover(self.extra_dirs()))

    def extra_dirs(self) -> list[str]:
        raw = self.qsettings.value("model/dirs", "[]")
        try:
            dirs = json.loads(raw) if isinstance(raw, str) else []
        except ValueError:
            dirs = []
        return [d for d in dirs if isinstance(d, str)]

    def open_manager(self) -> Any:
        from app.qt.engine_link.model_manager import ModelManager

        dlg = ModelManager(self.chat.jobs, self.extra_dirs(), self.chat.link.spec, self.window)
        dlg.modelChosen.connect(lambda spec, name: self.load(spec, name))
        dlg.dirsChanged.connect(lambda dirs: self.qsettings.setValue("model/dirs", json.dumps(dirs)))
        dlg.finished.connect(lambda _: self.discover())
        dlg.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dlg.open()
        return dlg

    def open_server_dialog(self) -> Any:
        from app.qt.engine_link.server_dialog import ServerDialog

        last = self.qsettings.value("server/url")
        url = last if isinstance(last, str) else ""
        dlg = ServerDialog(url, self.server_key(url) or "", self.window)

        def chosen(url: str, key: str, remember: bool) -> None:
            api_keys.remember(self.qsettings, url, key, remember)
            self.chat.link.connect(url, key or None)

        dlg.chosen.connect(chosen)
        dlg.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dlg.open()
        return dlg

    def disconnect(self) -> None:
        """Back to a model in this process: the last one used here (else the demo)."""
        if self.chat.link.server is not None:
            self.load(self.chat.link.fallback_spec or "demo")

    # -- what the link tells -----------------------------------------------------------------------
    def _loading(self, spec: str, name: str) -> None:
        self.model_label.setText(f"Loading {name}…")
        self.model_status.setText("loading…")
        self.picker.select(spec, name)

    def _progress(self, fraction: float, message: str) -> None:
        self.progress.setVisible(True)
        self.progress.setValue(int(fraction * 1000))
        self.model_status.setText(load_step_text(fraction, message))

    def _failed(self, why: str, title: str) -> None:
        self.server_toggle.set_model(None)
        self.progress.setVisible(False)
        self.model_status.setText("no model loaded")
        self.model_label.setText("No model")
        self.chat.notices.error(title, why)

    def _loaded(self, spec: str, name: str, info: ModelInfo) -> None:
        self.progress.setVisible(False)
        self.qsettings.setValue("model/last", spec)  # a server's address too: the next start attaches again
        server = self.chat.link.server
        if server is not None and server.url == spec:
            self.server_toggle.set_model(None)  # this window's own server serves only an in-process model
            self.model_status.setText(f"on a Verbatim server: {server.where}")
            self.picker.select(spec, f"{name} (server)")
            self.chat.notices.status(f"Connected: {name} · {server.where}", 4000)
            log.info("attached to %s · %s", name, server.where)
            return
        self.server_toggle.set_model(info, spec, self.chat.link.engine_chunk, self.chat.link.template_reads)
        self.model_status.setText(f"{info.layers} layers · loaded in {info.load_s:.1f} s")
        self.model_label.setText(name)
        self.qsettings.setValue("model/last_local", spec)
        self.picker.select(spec, name)
        self.chat.notices.status(f"Loaded {name}", 4000)
        log.info("model loaded: %s (%d layers, %.1f s)", name, info.layers, info.load_s)

    def _show_server(self, server: Optional[ServerLink]) -> None:
        """Where the model runs ("demo · 3 ranks at 127.0.0.1:8765") and whether it answers."""
        self.disconnect_action.setEnabled(server is not None)
        self.update_memory()  # only this window's own memory while the model runs on a server
        if server is None:
            self.model_label.setToolTip("")
            self.chat.notices.banner("")
            return
        where = f"{self.chat.link.name} · {server.where}"
        if server.up:
            self.model_label.setText(where)
            self.model_label.setToolTip(f"The model runs on the Verbatim server at {server.url}")
            self.chat.notices.banner("")
        else:
            self.model_label.setText(f"{where} · not reachable")
            self.model_label.setToolTip(server.error)
            self.chat.notices.banner(f"The server is not reachable: {server.error}. What you type is kept; Send works "
                                     "again as soon as the server answers (or pick a local model).")

    def update_memory(self) -> None:
        """The process's resident size (psutil) and, once a job reported it, MLX's active memory;
        attached to a server, only this window's own (the model's memory is the server's)."""
        try:
            rss = _process.memory_info().rss
        except psutil.Error:  # e.g. /proc unreadable in a sandbox
            rss = 0
        if self.chat.link.server is not None:
            self.memory_label.setText(f"This window {format_bytes(rss) if rss else '–'} · the model's memory is on the server")
            self.memory_label.setToolTip("The model runs on the server: its memory is not counted here")
            return
        text = f"Memory {format_bytes(rss)}" if rss else "Memory –"
        if self.chat.link.memory:
            text += f" (MLX {format_bytes(self.chat.link.memory)})"
        self.memory_label.setText(text)
        self.memory_label.setToolTip("This process's memory, and MLX's (the model, its caches)")

    def stop(self) -> None:
        """The window closes: no more readouts; the local server's requests stop."""
        self._memory.stop()
        if self.discovery is not None:
            self.discovery.cancel()
        self.server_toggle.shutdown()
