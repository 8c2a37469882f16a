"""A one-line label that may be narrower than its text: it shows the text elided (…) and the
whole text as its tooltip, so a long badge or status never pushes its row past the window."""

from __future__ import annotations

from typing import Optional

from PySide6.QtCore import QEvent, QSize, Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget


class ElidedLabel(QLabel):
    """`text()` is the whole text; what is drawn is elided to the width the layout gives.

    The size hint is the whole text's (the layout gives it room when there is some), the minimum
    is a few characters, so a row of these never sets a minimum width wider than the viewport."""

    MIN_CHARS = 4

    def __init__(self, text: str = "", parent: Optional[QWidget] = None,
                 mode: Qt.TextElideMode = Qt.TextElideMode.ElideRight) -> None:  # fmt: skip
        super().__init__(parent)
        self._full = ""
        self._mode = mode
        self._tip = ""  # a tooltip set by the caller wins over the automatic one
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setWordWrap(False)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        self.setText(text)

    def text(self) -> str:  # type: ignore[override]
        return self._full

    def setText(self, text: str) -> None:  # type: ignore[override]
        self._full = text or ""
        self._elide()
        self.updateGeometry()

    def setToolTip(self, tip: str) -> None:  # type: ignore[override]
        self._tip = tip
        super().setToolTip(tip or (self._full if self.is_elided() else ""))

    def is_elided(self) -> bool:
        return super().text() != self._full

    def _extra(self) -> int:
        """Width of the whole text minus the width of what is shown now."""
        fm = self.fontMetrics()
        return fm.horizontalAdvance(self._full) - fm.horizontalAdvance(super().text())

    def sizeHint(self) -> QSize:
        s = super().sizeHint()
        return QSize(s.width() + self._extra(), s.height())

    def minimumSizeHint(self) -> QSize:
        s = super().minimumSizeHint()
        fm = self.fontMetrics()
        shown = min(fm.horizontalAdvance(self._full), fm.horizontalAdvance("M" * self.MIN_CHARS))
        w = s.width() - fm.horizontalAdvance(super().text()) + shown
        return QSize(max(w, 0), s.height())

    def resizeEvent(self, event: QResizeEvent) -> None:  # type: ignore[override]
        super().resizeEvent(event)
        self._elide()

    def changeEvent(self, event: QEvent) -> None:  # type: ignore[override]
        super().changeEvent(event)
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):
            self._elide()  # a style sheet's font or padding changes the room the text has

    def _elide(self) -> None:
        fm = self.fontMetrics()
        # What the label adds around its text (margins, a style sheet's padding and border).
        overhead = super().sizeHint().width() - fm.horizontalAdvance(super().text())
        room = self.width() - overhead
        shown = self._full if fm.horizontalAdvance(self._full) <= room else fm.elidedText(self._full, self._mode, max(room, 0))
        if shown != super().text():
            super().setText(shown)
        super().setToolTip(self._tip or (self._full if shown != self._full else ""))
