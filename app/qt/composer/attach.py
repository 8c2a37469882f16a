"""The window's attach: the paperclip button, files dropped on the composer or the conversation, the
chips above the composer and their note, wired to the chat model's attachments
(app/core/composer/attachments.py). Nothing here reads a file: the core does, off the GUI thread."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Protocol

from PySide6.QtCore import QSettings, Qt
from PySide6.QtWidgets import QFileDialog, QToolButton, QWidget

from app.core.composer import attachments as att
from app.core import ops
from app.core.chat import ChatModel
from app.core.composer.context_budget import ContextBudget, short_count
from app.qt import dialogs
from app.qt.composer.attachment_bar import AttachmentBar, FileDrops

FILES = "Documents (*.pdf *.docx *.txt *.md *.markdown *.rst *.csv *.json *.py *.js *.ts *.c *.h *.cpp *.rs *.go *.java *.html *.tex);;All files (*)"
ATTACH_TIP = ("Attach files (PDF, .docx, text, Markdown, source code; or drop them here). They are read once"
              " and go after the system prompt: every later question about them, in any conversation,"
              " starts without reading them again.")


class Window(Protocol):
    """What the attach controls use of the main window (app/qt/window/window.py)."""

    chat: ChatModel
    qsettings: QSettings
    read_only: bool


class AttachControls:
    """The attach button, the drop targets and the chips of one window."""

    def __init__(self, window: Window) -> None:
        self.window = window
        self.bar = AttachmentBar()
        self.button = QToolButton()
        self.button.setObjectName("attachButton")
        self.button.setText("Attach")  # its icon (a paperclip) comes with the theme's style sheet
        self.button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonIconOnly)
        self.button.setToolTip(ATTACH_TIP)
        self.button.setAccessibleName("Attach files")
        self.button.clicked.connect(self.choose)
        self.drops = FileDrops(self.button)
        self.drops.dropped.connect(self.attach)

    def watch(self, *widgets: QWidget) -> None:
        for w in widgets:
            self.drops.watch(w)

    def wire(self) -> None:
        chat = self.window.chat
        chat.attachments.subscribe(att.CHANGED, self.bar.show_attachments)
        chat.attachments.subscribe(att.REFUSED, self.bar.show_refused)
        self.bar.removed.connect(chat.attachments.remove)
        chat.subscribe(ops.DRAFT, self._show_cost)

    def choose(self) -> None:
        """The attach button: pick files (the dialog starts in Documents, else the last folder)."""
        w = self.window
        paths, _ = QFileDialog.getOpenFileNames(self.button.window(), "Attach files",
                                                str(dialogs.start_dir(w.qsettings)), FILES)
        if paths:
            w.qsettings.setValue("files/last_dir", str(Path(paths[0]).parent))
            self.attach(paths)

    def attach(self, paths: list[str]) -> None:
        if self.window.read_only:
            return
        self.bar.clear_note()
        self.window.chat.attach(list(paths))

    def sent(self) -> None:
        self.bar.clear_note()

    def _show_cost(self, budget: Optional[ContextBudget]) -> None:
        """Documents go before the conversation: attached in the middle of one, the next reply
        reads the conversation again once. Say so, with the number, while it is the case."""
        chat = self.window.chat
        turns = budget.used - budget.draft if budget is not None and budget.draft else 0
        if chat.attachments.items and chat.vms and turns > 0:
            self.bar.show_cost(
                f"Documents go before the conversation: this reply reads the conversation's {short_count(turns)}"
                " earlier tokens again, once; later questions start at once.")
        else:
            self.bar.show_cost("")
