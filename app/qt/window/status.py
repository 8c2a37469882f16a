"""The window's status bar, banner and error dialogs, bound to the notices (app/core/notices.py)
and to the reply streaming (its progress, transient, on the status line)."""

from __future__ import annotations

from typing import Any

from PySide6.QtWidgets import QLabel, QStatusBar, QWidget

from app.core.chat import Chat
from app.qt import dialogs


class StatusLine:
    def __init__(self, chat: Chat, bar: QStatusBar, banner: QLabel, parent: QWidget) -> None:
        self.bar, self.banner, self.parent = bar, banner, parent
        n = chat.notices
        n.status_changed.connect(self._status)
        n.error_raised.connect(self._error)
        n.banner_changed.connect(self._banner)
        chat.generation.streamed.connect(lambda rid, text, tokens: bar.showMessage(f"Generating… {tokens} tokens"))
        chat.generation.replayed.connect(lambda rid, replay: bar.showMessage(replay.badge))

    def _status(self, text: str, ms: int) -> None:
        self.bar.showMessage(text, ms)

    def _banner(self, text: str) -> None:
        self.banner.setText(text)
        self.banner.setVisible(bool(text))

    def _error(self, title: str, text: str) -> Any:
        self.bar.showMessage(f"{title}: {text}", 10000)
        return dialogs.error_box(self.parent, title, text)
