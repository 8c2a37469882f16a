"""What the window keeps of itself across restarts, in its QSettings: where it was (geometry, the
docks, the sidebar splitter) and the run picked in each reply's runs menu (a view setting, not the
conversation's data: the latest RUNS_KEPT picks)."""

from __future__ import annotations

import json

from PySide6.QtCore import QByteArray, QSettings
from PySide6.QtWidgets import QMainWindow, QSplitter

from app.qt.window.dock_width import DockWidth

RUNS_KEPT = 500


class WindowState:
    def __init__(self, qsettings: QSettings) -> None:
        self.qsettings = qsettings

    def restore(self, window: QMainWindow, splitter: QSplitter, dock_width: DockWidth) -> None:
        """Put the window back where it was when it last closed (nothing stored: as built)."""
        s = self.qsettings
        geo = s.value("window/geometry")
        if isinstance(geo, QByteArray) and not geo.isEmpty():
            window.restoreGeometry(geo)
        state = s.value("window/state")
        if isinstance(state, QByteArray) and not state.isEmpty():
            dock_width.restored(window.restoreState(state))  # the user's dock width, if any
        split = s.value("window/splitter")
        if isinstance(split, QByteArray) and not split.isEmpty():
            splitter.restoreState(split)

    def save(self, window: QMainWindow, splitter: QSplitter) -> None:
        """Store the window's geometry, docks and splitter (at close)."""
        s = self.qsettings
        s.setValue("window/geometry", window.saveGeometry())
        s.setValue("window/state", window.saveState())
        s.setValue("window/splitter", splitter.saveState())
        s.sync()

    def picked_runs(self) -> dict[int, int]:
        """reply id -> run index, as the last session left them ({} when none or unreadable)."""
        try:
            raw = json.loads(str(self.qsettings.value("view/runs_shown", "{}")))
            return {int(k): int(v) for k, v in raw.items()}
        except (ValueError, TypeError, AttributeError):
            return {}

    def keep_picked_runs(self, runs: dict[int, int]) -> None:
        kept = dict(list(runs.items())[-RUNS_KEPT:])
        self.qsettings.setValue("view/runs_shown", json.dumps({str(k): v for k, v in kept.items()}))
