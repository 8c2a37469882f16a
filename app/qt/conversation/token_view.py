"""One reply token by token, each coloured by its probability; hovering shows id, text, logprob.

One QTextDocument with a char format per token (no widget per token), so 4k tokens lay out in
one pass; the token under the mouse is found by a hit test and a bisect over token offsets. It
is as tall as its text at its width, as the message's body is: the conversation scrolls it, never
a box of its own inside the message.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import Optional, Sequence

from PySide6.QtCore import QEvent, QPoint, QPointF, QSize, Qt
from PySide6.QtGui import QColor, QKeyEvent, QTextCharFormat, QTextCursor, QTextDocument
from PySide6.QtWidgets import QFrame, QSizePolicy, QTextEdit, QToolTip, QWidget

from app.core.conversation.view_models import token_tooltip
from app.qt.conversation.scroll_keys import scrolls_the_conversation

EMPTY_PIECE = "·"  # shown for a token that completes no character on its own


def probability_color(logprob: float, divergent: bool = False) -> QColor:
    """Background of a token: clear when the model was sure, warmer as the probability falls."""
    if divergent:
        return QColor(207, 34, 46, 150)
    p = math.exp(logprob) if logprob > -700 else 0.0
    if p >= 0.9:
        return QColor(0, 0, 0, 0)
    # hue from green (p = 0.9) through yellow to red (p = 0); stronger as p falls
    hue = 0.33 * p / 0.9
    color = QColor.fromHsvF(hue, 0.85, 0.95)
    color.setAlphaF(0.25 + 0.45 * (1 - p))
    return color


class TokenView(QTextEdit):
    def __init__(self, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.setObjectName("tokenView")
        self.setReadOnly(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setMouseTracking(True)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.tokens: list[int] = []
        self.pieces: list[str] = []
        self.logprobs: list[float] = []
        self.starts: list[int] = []  # character offset of each token in the document
        self.divergent: Optional[int] = None

    def set_tokens(self, tokens: Sequence[int], pieces: Optional[Sequence[str]], logprobs: Sequence[float],
                   divergent: Optional[int] = None) -> None:
        """Show a reply; `pieces` is the text of each token (None: token ids instead)."""
        self.tokens = list(tokens)
        self.pieces = list(pieces) if pieces is not None else [f"#{t} " for t in tokens]
        self.logprobs = list(logprobs)
        self.divergent = divergent
        doc = QTextDocument(self)
        doc.setDefaultFont(self.font())
        cursor = QTextCursor(doc)
        cursor.beginEditBlock()
        self.starts = []
        for i, (piece, lp) in enumerate(zip(self.pieces, self.logprobs)):
            fmt = QTextCharFormat()
            fmt.setBackground(probability_color(lp, i == divergent))
            if i == divergent:
                fmt.setFontUnderline(True)
            self.starts.append(cursor.position())
            cursor.insertText(piece or EMPTY_PIECE, fmt)
        cursor.endEditBlock()
        self.setDocument(doc)
        doc.documentLayout().documentSizeChanged.connect(self._fit)
        doc.setTextWidth(self.viewport().width())
        self._fit()

    def resizeEvent(self, event: QEvent) -> None:  # type: ignore[override]
        super().resizeEvent(event)
        self.document().setTextWidth(self.viewport().width())
        self._fit()

    def _fit(self, *_: object) -> None:
        """As tall as the text at this width (and its frame): nothing to scroll inside."""
        h = math.ceil(self.document().size().height()) + 2 * self.frameWidth()
        if h != self.height():
            self.setFixedHeight(h)

    def sizeHint(self) -> QSize:
        return QSize(400, self.height())

    def wheelEvent(self, event: QEvent) -> None:  # type: ignore[override]
        event.ignore()  # the conversation scrolls, not this (unscrollable) view

    def keyPressEvent(self, event: QKeyEvent) -> None:  # type: ignore[override]
        if scrolls_the_conversation(event):
            event.ignore()  # up to the conversation, as a message's text does
            return
        super().keyPressEvent(event)

    def token_at(self, pos: QPoint) -> Optional[int]:
        """The token under a viewport position, or None."""
        offset = QPointF(pos.x() + self.horizontalScrollBar().value(), pos.y() + self.verticalScrollBar().value())
        char = self.document().documentLayout().hitTest(offset, Qt.HitTestAccuracy.ExactHit)
        if char < 0 or not self.starts:
            return None
        i = bisect_right(self.starts, char) - 1
        return i if 0 <= i < len(self.tokens) else None

    def tooltip(self, i: int) -> str:
        return token_tooltip(self.tokens[i], self.pieces[i], self.logprobs[i])

    def viewportEvent(self, event: QEvent) -> bool:  # type: ignore[override]
        if event.type() == QEvent.Type.ToolTip:
            i = self.token_at(event.pos())  # type: ignore[attr-defined]
            if i is None:
                QToolTip.hideText()
            else:
                QToolTip.showText(event.globalPos(), self.tooltip(i), self)  # type: ignore[attr-defined]
            return True
        return super().viewportEvent(event)
