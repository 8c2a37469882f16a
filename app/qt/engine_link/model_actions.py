"""The window's model controls: what it shows while a model loads, the memory readout, the model
folders setting, the model manager, and the window attached to a Verbatim server (connect,
disconnect, where the model runs and whether it answers). Functions over the main window
(app/qt/window/window.py)."""

from __future__ import annotations

import json
import logging
from typing import Any, Optional

import psutil
from PySide6.QtCore import QSettings, Qt, QTimer
from PySide6.QtWidgets import QLabel, QProgressBar, QStatusBar

from app.core.engine_link import flows
from app.core.engine_link import api_keys
from app.core.chat import ServerLink
from app.core.conversation.view_models import format_bytes
from engine.engine import ModelInfo

MainWindow = Any  # app/qt/window/window.py's (not imported: the window imports this module)

log = logging.getLogger(__name__)


def show_model(w: MainWindow, what: str, *args: Any) -> None:
    """One `engine_flows.MODEL` event: loading, progress, loaded, failed."""
    if w._closed:
        return
    if what == "loading":
        spec, name = args
        w.model_label.setText(f"Loading {name}…")
        w.model_status.setText("loading…")
        w.model_picker.select(spec, name)
    elif what == "progress":
        fraction, message = args
        w.progress.setVisible(True)
        w.progress.setValue(int(fraction * 1000))
        w.model_status.setText(f"{message} {fraction:.0%}" if fraction < 1 else message)  # no "done 100%"
    elif what == "loaded":
        _loaded(w, *args)
    else:
        w.server_toggle.set_model(None)
        w.progress.setVisible(False)
        w.model_status.setText("no model loaded")
        w.model_label.setText("No model")
        w.show_error(args[1] if len(args) > 1 else "Cannot load the model", args[0])


def _loaded(w: MainWindow, spec: str, name: str, info: ModelInfo) -> None:
    w.progress.setVisible(False)
    w.chat_view.set_assistant_name(name)
    w.qsettings.setValue("model/last", spec)  # a server's address too: the next start attaches again
    link = w.chat.link
    if link is not None and link.url == spec:
        w.server_toggle.set_model(None)  # this window's own server serves only an in-process model
        w.model_status.setText(f"on a Verbatim server: {link.where}")
        w.model_picker.select(spec, f"{name} (server)")
        w.status(f"Connected: {name} · {link.where}", 4000)
        log.info("attached to %s · %s", name, link.where)
        return
    w.server_toggle.set_model(info, spec, w.chat.engine_chunk)
    w.model_status.setText(f"{info.layers} layers · loaded in {info.load_s:.1f} s")
    w.model_label.setText(name)
    w.qsettings.setValue("model/last_local", spec)
    w.chat.set_fallback(spec)  # what a window whose server is gone at start loads instead
    w.model_picker.select(spec, name)
    w.status(f"Loaded {name}", 4000)
    log.info("model loaded: %s (%d layers, %.1f s)", name, info.layers, info.load_s)


# ----------------------------------------------------------------------------- a server's model
def show_link(w: MainWindow, link: Optional[ServerLink]) -> None:
    """Where the model runs ("demo · 3 ranks at 127.0.0.1:8765") and whether it answers."""
    where = f"{w.chat.model_name} · {link.where}" if link is not None else ""
    if w._closed:
        return
    w.disconnect_action.setEnabled(link is not None)
    w.update_memory()  # only this window's own memory while the model runs on a server
    w.debug_panel.clear_button.setEnabled(link is None)  # a server's cache is its own
    if link is None:
        w.model_label.setToolTip("")
        w.banner_text("")
        w._update_actions()
        return
    if link.up:
        w.model_label.setText(where)
        w.model_label.setToolTip(f"The model runs on the Verbatim server at {link.url}")
        w.banner_text("")
        w.debug_panel.forget_failure()  # "Cold run: failed: cannot reach the server" is stale now
    else:
        w.model_label.setText(f"{where} · not reachable")
        w.model_label.setToolTip(link.error)
        w.banner_text(f"The server is not reachable: {link.error}. What you type is kept; Send works again "
                      "as soon as the server answers (or pick a local model).")
    w._update_actions()


def server_key(w: MainWindow, url: str) -> Optional[str]:
    """The remembered API key of the server at `url`, if any (the keyring's: app/core/engine_link/api_keys.py)."""
    return api_keys.remembered_key(w.qsettings, url)


def move_key_to_keyring(w: MainWindow) -> None:
    """At start: a key kept in settings.ini moves to the keyring (the window holding the data
    folder's lock does it; a read-only second window writes no settings)."""
    if not w.read_only:
        api_keys.migrate(w.qsettings)


def open_server_dialog(w: MainWindow) -> Any:
    from app.qt.engine_link.server_dialog import ServerDialog

    last = w.qsettings.value("server/url")
    url = last if isinstance(last, str) else ""
    dlg = ServerDialog(url, server_key(w, url) or "", w)

    def chosen(url: str, key: str, remember: bool) -> None:
        api_keys.remember(w.qsettings, url, key, remember)
        flows.connect_server(w.chat, url, key or None)

    dlg.chosen.connect(chosen)
    dlg.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dlg.open()
    return dlg


def disconnect_server(w: MainWindow) -> None:
    """Back to a model in this process: the last one used here (else the demo)."""
    if w.chat.link is not None:
        w.load_model(w.chat.fallback_spec or "demo")


def status_widgets(bar: QStatusBar) -> tuple[QProgressBar, QLabel, QLabel]:
    """The status bar's load progress, model name and memory readout."""
    progress = QProgressBar()
    progress.setRange(0, 1000)
    progress.setMaximumWidth(180)
    progress.setTextVisible(False)
    progress.setVisible(False)
    model_label = QLabel()
    model_label.setObjectName("statusModel")
    memory_label = QLabel()
    memory_label.setObjectName("statusMemory")
    for widget in (progress, model_label, memory_label):
        bar.addPermanentWidget(widget)
    return progress, model_label, memory_label


def memory_timer(w: MainWindow, ms: int = 2000) -> QTimer:
    """The memory readout, now and every `ms`."""
    timer = QTimer(w)
    timer.timeout.connect(w.update_memory)
    timer.start(ms)
    w.update_memory()
    return timer


_process = psutil.Process()


def update_memory(w: MainWindow) -> None:
    """The process's resident size (psutil) and, once a job reported it, MLX's active memory;
    attached to a server, only this window's own (the model's memory is the server's)."""
    try:
        rss = _process.memory_info().rss
    except psutil.Error:  # e.g. /proc unreadable in a sandbox
        rss = 0
    if w.chat.link is not None:
        w.memory_label.setText(f"This window {format_bytes(rss) if rss else '–'} · the model's memory is on the server")
        w.memory_label.setToolTip("The model runs on the server: its memory is not counted here")
        return
    text = f"Memory {format_bytes(rss)}" if rss else "Memory –"
    if w.chat.mlx_memory:
        text += f" (MLX {format_bytes(w.chat.mlx_memory)})"
    w.memory_label.setText(text)
    w.memory_label.setToolTip("This process's memory, and MLX's (the model, its caches)")


def extra_model_dirs(qsettings: QSettings) -> list[str]:
    raw = qsettings.value("model/dirs", "[]")
    try:
        dirs = json.loads(raw) if isinstance(raw, str) else []
    except ValueError:
        dirs = []
    return [d for d in dirs if isinstance(d, str)]


def open_model_manager(w: MainWindow) -> Any:
    from app.qt.engine_link.model_manager import ModelManager

    dlg = ModelManager(w.chat, extra_model_dirs(w.qsettings), w.chat.model_spec, w)
    dlg.modelChosen.connect(lambda spec, name: w.load_model(spec, name))
    dlg.dirsChanged.connect(lambda dirs: w.qsettings.setValue("model/dirs", json.dumps(dirs)))
    dlg.finished.connect(lambda _: w.discover_models())
    dlg.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dlg.open()
    return dlg
