"""The window's status bar, banner and error dialogs, bound to the notices (app/core/notices.py)
and to the reply streaming (its progress, transient, on the status line).

The status bar shows one line and cuts what does not fit; a status too long for the room it has
goes to the notice area instead (whole and wrapped, until the next reply or conversation), and an
error's status line is its title when its text does not fit (the dialog has the text).
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QStatusBar, QWidget

from app.core.chat import Chat
from app.qt import dialogs

ROOM_MARGIN = 16  # px the status bar keeps between its message and the widgets on its right


class StatusLine:
    def __init__(self, chat: Chat, bar: QStatusBar, banner: QLabel, parent: QWidget) -> None:
        self.bar, self.banner, self.parent = bar, banner, parent
        self.notices = n = chat.notices
        n.status_changed.connect(self._status)
        n.error_raised.connect(self._error)
        n.banner_changed.connect(self._banner)
        chat.generation.streamed.connect(lambda rid, text, tokens: bar.showMessage(f"Generating… {tokens} tokens"))
        chat.generation.replayed.connect(lambda rid, replay: bar.showMessage(replay.badge))

    def room(self) -> int:
        """The width the status bar's message has: up to the leftmost widget shown on its right."""
        shown = [w.x() for w in self.bar.findChildren(QWidget, options=Qt.FindChildOption.FindDirectChildrenOnly)
                 if w.isVisible() and w.width() > 0]  # fmt: skip
        return min(shown + [self.bar.width()]) - ROOM_MARGIN

    def fits(self, text: str) -> bool:
        return self.bar.fontMetrics().horizontalAdvance(text) <= self.room()

    def _status(self, text: str, ms: int) -> None:
        if text and not self.fits(text):  # cut in the bar: said whole in the notice area instead
            self.bar.clearMessage()
            self.notices.tell(text)
            return
        self.bar.showMessage(text, ms)

    def _banner(self, text: str) -> None:
        self.banner.setText(text)
        self.banner.setVisible(bool(text))

    def _error(self, title: str, text: str) -> Any:
        line = f"{title}: {text}"
        self.bar.showMessage(line if self.fits(line) else title, 10000)
        return dialogs.error_box(self.parent, title, text)
