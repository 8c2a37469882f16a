"""The notice above the composer: an explanation that must stay readable (why a send did not go,
where a regenerate put the later turns), wrapped over as many lines as it needs and never elided
as the status bar elides. It stays until the next reply or conversation, or its × is clicked.

Bound to the notices (app/core/notices.py: `notice_changed`); the status bar keeps only the
transient progress ("Generating… 12 tokens").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QToolButton, QWidget

from app.qt.widgets.wrap_label import WrapLabel

if TYPE_CHECKING:
    from app.core.notices import Notices


class Notice(QFrame):
    def __init__(self, notices: Optional["Notices"] = None, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.setObjectName("notice")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(10, 6, 6, 6)
        lay.setSpacing(6)
        self.label = WrapLabel("", self)  # as tall as its wrapped text, at any width
        self.label.setObjectName("noticeText")
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(self.label, 1)
        self.close_button = QToolButton()
        self.close_button.setObjectName("noticeClose")
        self.close_button.setText("×")
        self.close_button.setToolTip("Dismiss")
        self.close_button.setAutoRaise(True)
        lay.addWidget(self.close_button, 0, Qt.AlignmentFlag.AlignTop)
        self.setVisible(False)
        if notices is not None:
            notices.notice_changed.connect(self.show_text)
            self.close_button.clicked.connect(lambda: notices.tell(""))
        else:
            self.close_button.clicked.connect(lambda: self.show_text(""))

    def text(self) -> str:
        return self.label.text()

    def show_text(self, text: str) -> None:
        """Show `text` whole ('' hides the notice)."""
        self.label.setText(text)
        self.setVisible(bool(text))
