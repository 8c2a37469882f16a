"""Attached files as chips: above the composer (removable until Send) and on a sent user message
(read-only), and `FileDrops`, which takes files dropped on the composer or the conversation.

Each chip is a row: the file's name, its pages and what it adds to the prompt in tokens
('report.pdf · 12 pages · 6,120 tokens'), wrapped, never elided; in the composer a × removes it.
The composer's bar also carries the note that stays until the next attach or Send: a file that
could not be read (named, with why), and what attaching in the middle of a conversation costs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from PySide6.QtCore import QEvent, QObject, Signal
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QFrame, QHBoxLayout, QToolButton, QVBoxLayout, QWidget

from app.core.composer.attachments import Attachment, chip_text, unread_note
from app.qt.widgets.wrap_label import WrapLabel
from engine.documents.document import Document, shown_name

class Chip(QFrame):
    """One attached file."""

    removed = Signal()

    def __init__(self, text: str, tip: str, removable: bool, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.setObjectName("documentChip")
        row = QHBoxLayout(self)
        row.setContentsMargins(8, 3, 4, 3)
        row.setSpacing(6)
        self.label = WrapLabel(text, self)
        self.label.setObjectName("documentChipText")
        self.setToolTip(tip)
        row.addWidget(self.label, 1)
        self.remove_button: Optional[QToolButton] = None
        if removable:
            self.remove_button = QToolButton(self)
            self.remove_button.setObjectName("documentChipRemove")
            self.remove_button.setText("×")
            self.remove_button.setToolTip("Remove this file from the message")
            self.remove_button.setAutoRaise(True)
            self.remove_button.clicked.connect(self.removed)
            row.addWidget(self.remove_button)

    @property
    def text(self) -> str:
        return self.label.text()


class ChipList(QWidget):
    """Chips one under another (a long name wraps; none is cut)."""

    removed = Signal(int)  # index of the chip whose × was clicked

    def __init__(self, removable: bool, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.removable = removable
        self._lay = QVBoxLayout(self)
        self._lay.setContentsMargins(0, 0, 0, 0)
        self._lay.setSpacing(3)
        self.chips: list[Chip] = []
        self.setVisible(False)

    def set_chips(self, items: Sequence[tuple[str, str]]) -> None:
        """Show one chip per (text, tooltip)."""
        for chip in self.chips:
            self._lay.removeWidget(chip)
            chip.deleteLater()
        self.chips = []
        for i, (text, tip) in enumerate(items):
            chip = Chip(text, tip, self.removable, self)
            chip.removed.connect(lambda i=i: self.removed.emit(i))
            self._lay.addWidget(chip)
            self.chips.append(chip)
        self.setVisible(bool(self.chips))

    def texts(self) -> list[str]:
        return [c.text for c in self.chips]


def document_chips(documents: Sequence[Document]) -> list[tuple[str, str]]:
    """A sent message's chips (its stored documents: no token count kept with them)."""
    return [(chip_text(d), f"{shown_name(d.name)} (sha256 {d.digest[:16]}…): {len(d.text):,} characters of {d.kind}"
             f" text.{unread_note(d)}") for d in documents]


class AttachmentBar(QWidget):
    """The composer's attached files and their note."""

    removed = Signal(int)

    def __init__(self, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.setObjectName("attachmentBar")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(3)
        self.chips = ChipList(removable=True, parent=self)
        self.chips.removed.connect(self.removed)
        lay.addWidget(self.chips)
        self.note = WrapLabel("", self)
        self.note.setObjectName("attachmentNote")
        self.note.setVisible(False)
        lay.addWidget(self.note)
        self._refused = ""
        self._cost = ""

    def show_attachments(self, items: Sequence[Attachment]) -> None:
        self.chips.set_chips([(a.chip, a.tooltip) for a in items])

    def show_refused(self, refused: Sequence[str]) -> None:
        """Files that could not be attached: named, with why; kept until the next attach or Send."""
        self._refused = "Not attached: " + "; ".join(refused) + "." if refused else ""
        self._show_note()

    def show_cost(self, text: str) -> None:
        self._cost = text
        self._show_note()

    def clear_note(self) -> None:
        self._refused = ""
        self._show_note()

    def _show_note(self) -> None:
        text = "\n".join(t for t in (self._refused, self._cost) if t)
        self.note.setText(text)
        self.note.setVisible(bool(text))


def dropped_files(event: QDropEvent | QDragEnterEvent) -> list[str]:
    """The local files a drag carries (folders and remote URLs are not documents)."""
    mime = event.mimeData()
    if not mime.hasUrls():
        return []
    return [u.toLocalFile() for u in mime.urls() if u.isLocalFile() and Path(u.toLocalFile()).is_file()]


class FileDrops(QObject):
    """Event filter: files dropped on the watched widget are attached (not pasted as paths)."""

    dropped = Signal(list)  # list[str]: local file paths

    def watch(self, widget: QWidget) -> None:
        widget.setAcceptDrops(True)
        widget.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # type: ignore[override]
        kind = event.type()
        if kind in (QEvent.Type.DragEnter, QEvent.Type.DragMove) and dropped_files(event):  # type: ignore[arg-type]
            event.acceptProposedAction()  # type: ignore[attr-defined]
            return True
        if kind == QEvent.Type.Drop:
            files = dropped_files(event)  # type: ignore[arg-type]
            if files:
                event.acceptProposedAction()  # type: ignore[attr-defined]
                self.dropped.emit(files)
                return True
        return False
