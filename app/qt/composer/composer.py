"""The message composer: Enter sends, Shift+Enter inserts a newline.

Bound to the composer (app/core/composer/model.py), the one holder of the draft: what is typed
goes there at once (the model counts the next prompt once typing pauses), and the draft is written
to the store once typing pauses for DRAFT_SAVE_MS (superqt's `qdebounced`); a text the model sets
(another conversation's draft, a send, a refused send's text back) is shown here.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit, QWidget
from superqt.utils import qdebounced

if TYPE_CHECKING:
    from app.core.composer.model import Composer as ComposerModel

DRAFT_SAVE_MS = 1000  # the draft is written to the store once typing pauses this long


class Composer(QPlainTextEdit):
    submitted = Signal()

    MIN_LINES, MAX_LINES = 2, 10

    def __init__(self, model: Optional["ComposerModel"] = None, read_only: bool = False,
                 parent: Optional[QWidget] = None) -> None:  # fmt: skip
        super().__init__(parent)
        self.setObjectName("composer")
        self.setPlaceholderText("Message (Enter to send, Shift+Enter for a new line)")
        self.setTabChangesFocus(True)
        self.setReadOnly(read_only)
        self.document().contentsChanged.connect(self._fit)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)  # rewrapped
        self._fit()
        if model is not None:
            self._bind(model)

    def _bind(self, model: "ComposerModel") -> None:
        self.save_draft = qdebounced(model.save, DRAFT_SAVE_MS, parent=self)

        def typed() -> None:
            text = self.toPlainText()
            if text != model.text:
                model.type(text)
                self.save_draft()

        self.textChanged.connect(typed)
        model.text_changed.connect(self.show_text)

    def show_text(self, text: str) -> None:
        """The draft as the model set it (not again when it is what is shown)."""
        if text != self.toPlainText():
            self.setPlainText(text)

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
