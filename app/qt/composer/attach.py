"""The window's attach: the paperclip button, files dropped on the composer or the conversation, the
chips above the composer and their note, bound to the composer's attachments
(app/core/composer/attachments.py). Nothing here reads a file: the core does, off the GUI thread."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from PySide6.QtCore import QSettings, Qt
from PySide6.QtWidgets import QFileDialog, QToolButton, QWidget

from app.core.chat import Chat
from app.core.composer.context_budget import ContextBudget, short_count
from app.core.store import Action
from app.qt import dialogs
from app.qt.composer.attachment_bar import AttachmentBar, FileDrops

FILES = "Documents (*.pdf *.docx *.txt *.md *.markdown *.rst *.csv *.json *.py *.js *.ts *.c *.h *.cpp *.rs *.go *.java *.html *.tex);;All files (*)"
ATTACH_TIP = ("Attach files (PDF, .docx, text, Markdown, source code; or drop them here). They are read once"
              " and go after the system prompt: every later question about them, in any conversation,"
              " starts without reading them again.")


class AttachControls:
    """The attach button, the drop targets and the chips of one window."""

    def __init__(self, chat: Chat, qsettings: QSettings) -> None:
        self.chat, self.qsettings = chat, qsettings
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
        composer = chat.composer
        composer.attachments.changed.connect(lambda items: self._show_chips())
        composer.attachments.refused.connect(self.bar.show_refused)
        self.bar.removed.connect(composer.remove_file)
        composer.budget_changed.connect(self._show_cost)
        composer.budget_changed.connect(lambda budget: self._show_chips())
        composer.attachments.reading_changed.connect(lambda names: self._show_chips())
        chat.generation.started.connect(self._started)

    def watch(self, *widgets: QWidget) -> None:
        for w in widgets:
            self.drops.watch(w)

    def choose(self) -> None:
        """The attach button: pick files (the dialog starts in Documents, else the last folder)."""
        paths, _ = QFileDialog.getOpenFileNames(self.button.window(), "Attach files",
                                                str(dialogs.start_dir(self.qsettings)), FILES)
        if paths:
            self.qsettings.setValue("files/last_dir", str(Path(paths[0]).parent))
            self.attach(paths)

    def attach(self, paths: list[str]) -> None:
        if self.chat.read_only:
            return
        self.bar.clear_note()
        self.chat.composer.attach(list(paths))

    def _show_chips(self) -> None:
        """The chips, with why Send is refused for them when the last count of this very draft
        says so (a count of another draft or other files says nothing about these)."""
        c = self.chat.composer
        budget = c.budget if c.counted(c.text) else None
        self.bar.show_attachments(c.attachments.items, budget, c.attachments.reading)

    def _started(self, pending: Any) -> None:
        if pending.action is Action.SEND:  # the files went with the message: their note is over
            self.bar.clear_note()

    def _show_cost(self, budget: Optional[ContextBudget]) -> None:
        """Documents go before the conversation: attached in the middle of one, the next reply
        reads the conversation again once. Say so, with the number, while it is the case."""
        turns = budget.used - budget.draft if budget is not None and budget.draft else 0
        if self.chat.composer.attachments.items and self.chat.conversation.vms and turns > 0:
            self.bar.show_cost(
                f"Documents go before the conversation: this reply reads the conversation's {short_count(turns)}"
                " earlier tokens again, once; later questions start at once.")
        else:
            self.bar.show_cost("")
