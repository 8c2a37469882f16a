"""A word-wrapped label that is always as tall as its wrapped text.

A plain QLabel with word wrap gets its height from a size hint computed for some other width,
and inside a scroll area (the conversation) the layout does not ask height-for-width: a footer
or badge that wraps to two lines got one line's height and was cut. This label sets its own
height from its width on every resize and text change. On one line (word wrap off) it
has no minimum width: see minimumSizeHint.
"""

from __future__ import annotations

from typing import Optional

from PySide6.QtCore import QEvent, QRect, QSize, Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget

QWIDGETSIZE_MAX = (1 << 24) - 1  # Qt's 'no maximum'


class WrapLabel(QLabel):
    def __init__(self, text: str = "", parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setWordWrap(True)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.setText(text)

    def setText(self, text: str) -> None:  # type: ignore[override]
        super().setText(text)
        self._fit()

    def setWordWrap(self, on: bool) -> None:  # type: ignore[override]
        super().setWordWrap(on)
        self._fit()
        self.updateGeometry()

    def minimumSizeHint(self) -> QSize:
        """One line: no minimum width (whoever places it on one line checked that it fits, and
        it must not hold a row wider than the window when that shrinks); wrapped: QLabel's."""
        s = super().minimumSizeHint()
        return s if self.wordWrap() else QSize(0, s.height())

    def resizeEvent(self, event: QResizeEvent) -> None:  # type: ignore[override]
        super().resizeEvent(event)
        self._fit()

    def changeEvent(self, event: QEvent) -> None:  # type: ignore[override]
        super().changeEvent(event)
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):
            self._fit()

    def needed_height(self, width: int) -> int:
        """The height the text takes wrapped at `width` (the label's outer width), with the
        label's margins, frame and a style sheet's padding. Not QLabel.heightForWidth: that one
        never answers less than the minimum height, which this label sets itself (_fit)."""
        inner = self.contentsRect()
        extra_w = self.width() - inner.width() + 2 * self.margin()
        extra_h = self.height() - inner.height() + 2 * self.margin()
        flags = int(self.alignment()) | int(Qt.TextFlag.TextWordWrap)
        text = self.fontMetrics().boundingRect(QRect(0, 0, max(width - extra_w, 1), 100_000), flags, self.text())
        return text.height() + extra_h

    def _fit(self) -> None:
        """Wrapped: exactly as tall as the wrapped text; one line: its size hint (Fixed)."""
        if self.wordWrap() and self.text():
            h = self.needed_height(self.width())
            if (self.minimumHeight(), self.maximumHeight()) != (h, h):
                self.setFixedHeight(h)
        elif (self.minimumHeight(), self.maximumHeight()) != (0, QWIDGETSIZE_MAX):
            self.setMinimumHeight(0)
            self.setMaximumHeight(QWIDGETSIZE_MAX)
