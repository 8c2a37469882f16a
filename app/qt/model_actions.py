"""The window's model controls: what it shows while a model loads, the memory readout, the model
folders setting and the model manager. Functions over the main window (app/qt/window.py)."""

from __future__ import annotations

import json
import logging
from typing import Any

import psutil
from PySide6.QtCore import QSettings, Qt, QTimer
from PySide6.QtWidgets import QLabel, QProgressBar, QStatusBar

from app.core import engine_flows as flows
from app.core.view_models import format_bytes
from engine.engine import ModelInfo

MainWindow = Any  # app/qt/window.py's (not imported: the window imports this module)

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
        w.model_status.setText(f"{message} {fraction:.0%}")
    elif what == "loaded":
        _loaded(w, *args)
    else:
        w.server_toggle.set_model(None)
        w.progress.setVisible(False)
        w.model_status.setText("no model loaded")
        w.model_label.setText("No model")
        w.show_error("Cannot load the model", args[0])


def _loaded(w: MainWindow, spec: str, name: str, info: ModelInfo) -> None:
    w.server_toggle.set_model(info, spec)
    w.progress.setVisible(False)
    w.model_status.setText(f"{info.layers} layers · loaded in {info.load_s:.1f} s")
    w.model_label.setText(name)
    w.chat_view.set_assistant_name(name)
    w.qsettings.setValue("model/last", spec)
    w.model_picker.select(spec, name)
    w.status(f"Loaded {name}", 4000)
    log.info("model loaded: %s (%d layers, %.1f s)", name, info.layers, info.load_s)


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
    """The process's resident size (psutil) and, once a job reported it, MLX's active memory."""
    try:
        rss = _process.memory_info().rss
    except psutil.Error:  # e.g. /proc unreadable in a sandbox
        rss = 0
    text = f"Memory {format_bytes(rss)}" if rss else "Memory –"
    if w.chat.mlx_memory:
        text += f" (MLX {format_bytes(w.chat.mlx_memory)})"
    w.memory_label.setText(text)


def extra_model_dirs(qsettings: QSettings) -> list[str]:
    raw = qsettings.value("model/dirs", "[]")
    try:
        dirs = json.loads(raw) if isinstance(raw, str) else []
    except ValueError:
        dirs = []
    return [d for d in dirs if isinstance(d, str)]


def open_model_manager(w: MainWindow) -> Any:
    from app.qt.widgets.model_manager import ModelManager

    dlg = ModelManager(w.chat, extra_model_dirs(w.qsettings), w.chat.model_spec, w)
    dlg.modelChosen.connect(lambda spec, name: flows.load_model(w.chat, spec, name))
    dlg.dirsChanged.connect(lambda dirs: w.qsettings.setValue("model/dirs", json.dumps(dirs)))
    dlg.finished.connect(lambda _: w.discover_models())
    dlg.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dlg.open()
    return dlg
