"""Where the window was: its geometry, its docks (the debug panel's width) and the sidebar
splitter, kept in the window's QSettings across restarts."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QByteArray


def restore_window_state(w: Any) -> None:
    """Put the MainWindow `w` back where it was when it last closed (nothing stored: as built)."""
    geo = w.qsettings.value("window/geometry")
    if isinstance(geo, QByteArray) and not geo.isEmpty():
        w.restoreGeometry(geo)
    state = w.qsettings.value("window/state")
    if isinstance(state, QByteArray) and not state.isEmpty():
        w.dock_width.sized = w.restoreState(state)  # the user's dock width, if any
    split = w.qsettings.value("window/splitter")
    if isinstance(split, QByteArray) and not split.isEmpty():
        w.splitter.restoreState(split)


def save_window_state(w: Any) -> None:
    """Store the MainWindow `w`'s geometry, docks and splitter (at close)."""
    w.qsettings.setValue("window/geometry", w.saveGeometry())
    w.qsettings.setValue("window/state", w.saveState())
    w.qsettings.setValue("window/splitter", w.splitter.saveState())
    w.qsettings.sync()
