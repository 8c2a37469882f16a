"""The message composer: Enter sends, Shift+Enter inserts a newline."""

from __future__ import annotations

import math
from typing import Optional

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit, QWidget


class Composer(QPlainTextEdit):
    submitted = Signal()

    MIN_LINES, MAX_LINES = 2, 10

    def __init__(self, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.setObjectName("composer")
        self.setPlaceholderText("Message (Enter to send, Shift+Enter for a new line)")
        self.setTabChangesFocus(True)
        self.document().contentsChanged.connect(self._fit)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)  # rewrapped
        self._fit()

    def keyPressEvent(self, event: QKeyEvent) -> None:  # type: ignore[override]
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            mods = event.modifiers()
            if mods & Qt.KeyboardModifier.ShiftModifier:
                self.insertPlainText("\n")
                return
            if not mods & (Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.AltModifier):
                self.submitted.emit()
                return
        super().keyPressEvent(event)

    def _fit(self, *_: object) -> None:
        """Grow with the text from 2 to 10 lines as shown (wrapped lines count: a long paste
        without line breaks is many lines), then scroll."""
        shown = math.ceil(self.document().size().height())  # QPlainTextEdit: in lines, wrapped
        lines = max(self.MIN_LINES, min(self.MAX_LINES, shown))
        fm = self.fontMetrics()
        margins = self.contentsMargins()
        h = lines * fm.lineSpacing() + 2 * int(self.document().documentMargin()) + margins.top() + margins.bottom() + 4
        self.setFixedHeight(h)

    def event(self, e: QEvent) -> bool:
        handled = super().event(e)
        # Refit when the font or the style sheet's padding changes (the theme): after Qt applied it.
        if e.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange, QEvent.Type.Polish):
            self._fit()
        return handled
