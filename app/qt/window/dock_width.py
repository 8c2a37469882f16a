"""The debug dock's width: its default the first time it opens, and back to the width it had
once a window made smaller (which squeezes the dock) is made larger again."""

from __future__ import annotations

from typing import Any, Callable

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtWidgets import QDockWidget, QMainWindow

MIN_WIDTH, WIDTH = 260, 360  # narrow enough that sidebar + chat + dock fit the smallest window


class DockWidth(QObject):
    """`room()` is the most the dock may take (the window less the sidebar and the chat column's
    minimum). The width the user drags the dock to is the one it comes back to."""

    def __init__(self, window: QMainWindow, dock: QDockWidget, room: Callable[[], int]) -> None:
        super().__init__(window)
        self.window, self.dock, self.room = window, dock, room
        self.sized = False  # the dock has had its first width (or one restored with the window)
        self.wanted = WIDTH
        self._window_width = window.width()
        dock.setMinimumWidth(MIN_WIDTH)
        dock.visibilityChanged.connect(self._opened)
        window.installEventFilter(self)
        dock.installEventFilter(self)

    def restored(self, sized: bool) -> None:
        """The window's saved state was put back (`sized`: with the dock's width in it)."""
        self.sized = sized

    def _opened(self, visible: bool) -> None:
        """The first time the dock opens (no saved window state): its default width, at most
        what leaves the chat column its own minimum."""
        if not visible or self.sized:
            return
        self.sized = True
        self._set(max(MIN_WIDTH, min(WIDTH, self.room())))

    def _set(self, width: int) -> None:
        self.window.resizeDocks([self.dock], [width], Qt.Orientation.Horizontal)

    def eventFilter(self, obj: Any, event: Any) -> bool:  # noqa: N802 (Qt's name)
        if event.type() != QEvent.Type.Resize:
            return False
        if obj is self.window:
            grew = event.size().width() > self._window_width
            self._window_width = event.size().width()
            if grew and self.dock.isVisible() and self.dock.width() < self.wanted:
                width = min(self.wanted, self.room())
                if width > self.dock.width():
                    self._set(width)
        elif obj is self.dock and self.dock.isVisible() and self.window.width() == self._window_width:
            if self.window.isVisible() and self.sized:  # the user dragged the dock's edge
                self.wanted = max(MIN_WIDTH, event.size().width())
        return False
