"""The runs of a reply under its footer: "2 runs", a menu with one line per run.

A regenerate that comes out identical to an existing reply adds no copy, only a run (its own
report: TTFT, what was restored, from where). The footer shows the latest run; this menu the
others; picking one shows it in the footer and the debug panel.
"""

from __future__ import annotations

from typing import Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMenu, QToolButton


class RunsButton(QToolButton):
    chosen = Signal(int, str)  # run index (0: the first), its footer line

    def __init__(self) -> None:
        super().__init__()
        self.setObjectName("runsButton")
        self.setToolTip("Every run of this reply: pick one to see its numbers")
        self.setAutoRaise(True)
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        self.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.setMenu(QMenu(self))
        self.lines: tuple[str, ...] = ()
        # Hidden until a reply has two runs: a message with none (a user's, a reply streaming)
        # would otherwise show a bare, dead menu arrow and a row of blank height.
        self.setVisible(False)

    def set_runs(self, lines: tuple[str, ...], shown: Optional[int] = None) -> None:
        """One footer line per run, oldest first, the one shown checked (None: the latest);
        shown only when there is more than one."""
        current = len(lines) - 1 if shown is None else shown
        if lines == self.lines:  # the same runs (a menu entry may be mid-trigger: keep the actions)
            for k, action in enumerate(self.menu().actions()):
                action.setChecked(k == current)
            self.setVisible(len(lines) > 1)
            return
        self.lines = lines
        menu = self.menu()
        menu.clear()
        for k, line in enumerate(lines):
            action = QAction(line, menu)
            action.setCheckable(True)
            action.setChecked(k == current)
            action.triggered.connect(lambda _=False, k=k, line=line: self.chosen.emit(k, line))
            menu.addAction(action)
        self.setText(f"{len(lines)} runs")
        self.setVisible(len(lines) > 1)
