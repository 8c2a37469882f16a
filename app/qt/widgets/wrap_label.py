"""A word-wrapped label that is always as tall as its wrapped text.

A plain QLabel with word wrap gets its height from a size hint computed for some other width,
and inside a scroll area (the conversation) the layout does not ask height-for-width: a footer
or badge that wraps to two lines got one line's height and was cut. This label sets its own
minimum height from its width on every resize and text change.
"""

from __future__ import annotations

from typing import Optional

from PySide6.QtCore import QEvent, QRect, Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget


class WrapLabel(QLabel):
    def __init__(self, text: str = "", parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setWordWrap(True)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Minimum)
        self.setText(text)

    def setText(self, text: str) -> None:  # type: ignore[override]
        super().setText(text)
        self._fit()

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
        never answers less than the minimum height, which this label sets from it."""
        inner = self.contentsRect()
        extra_w, extra_h = self.width() - inner.width() + 2 * self.margin(), self.height() - inner.height() + 2 * self.margin()
        flags = int(self.alignment()) | int(Qt.TextFlag.TextWordWrap)
        text = self.fontMetrics().boundingRect(QRect(0, 0, max(width - extra_w, 1), 100_000), flags, self.text())
        return text.height() + extra_h

    def _fit(self) -> None:
        h = self.needed_height(self.width()) if self.wordWrap() and self.text() else 0
        if h != self.minimumHeight():
            self.setMinimumHeight(h)
