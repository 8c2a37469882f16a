"""What the window does to whole conversations: open (and reveal a search hit), new, rename,
delete, export, import, and a message's delete. Each asks what it must through app/qt/dialogs.py,
changes the chat through the operations (app/core/ops.py) and tells its errors through the
notices; the sidebar's requests come here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from PySide6.QtCore import QSettings, Qt
from PySide6.QtWidgets import QWidget

from app.core import ops
from app.core.chat import Chat
from app.core.store import StoreError
from app.qt import dialogs
from app.qt.conversation.chat_view import ChatView
from app.qt.conversation.sidebar import Sidebar


class ConversationActions:
    def __init__(self, chat: Chat, parent: QWidget, qsettings: QSettings, sidebar: Sidebar, chat_view: ChatView,
                 composer: QWidget) -> None:  # fmt: skip
        self.chat, self.parent, self.qsettings = chat, parent, qsettings
        self.sidebar, self.chat_view, self.composer = sidebar, chat_view, composer
        sidebar.selected.connect(self.open)
        sidebar.newRequested.connect(self.new)
        sidebar.renameRequested.connect(self.ask_rename)
        sidebar.deleteRequested.connect(lambda cid: self.delete(cid, confirm=True))
        sidebar.exportRequested.connect(self.export)

    @property
    def current(self) -> Optional[int]:
        return self.chat.conversation.conv_id

    def open(self, conv_id: Optional[int]) -> None:
        """A conversation picked in the list: shown (again), and its search hit revealed."""
        hit = self.sidebar.hit_for(conv_id) if conv_id is not None else None
        if conv_id != self.current or conv_id is None:
            self.show(conv_id)
        if hit is not None:
            self.reveal(hit)

    def show(self, conv_id: Optional[int]) -> None:
        """Show a conversation (None: a new, empty one); each keeps its draft."""
        ops.open_conversation(self.chat, conv_id)

    def reveal(self, message_id: int) -> None:
        """Scroll to a message and mark it and the search's words in it (a search hit), until
        the next action; one in another variant or branch is made active first."""
        if self.chat.conversation.vm(message_id) is None and not ops.switch_variant(self.chat, message_id):
            return
        self.chat_view.reveal(message_id, self.sidebar.terms())

    def new(self) -> None:
        """An empty chat; the conversation row is created by the first message."""
        self.sidebar.list.clearSelection()
        ops.new_conversation(self.chat)
        self.chat.listing.refresh()
        self.composer.setFocus(Qt.FocusReason.OtherFocusReason)

    def ask_rename(self, conv_id: int) -> None:
        title = dialogs.ask_title(self.parent, self.chat.session.title(conv_id))
        if title:
            self.rename(conv_id, title)

    def rename(self, conv_id: int, title: str) -> None:
        ops.rename(self.chat, conv_id, title)

    def delete(self, conv_id: int, confirm: bool = True) -> None:
        """Delete a conversation, asked first (one generating says why it waits instead)."""
        if confirm and ops.idle(self.chat, None, conv_id=conv_id) and not dialogs.confirm(
            self.parent, "Delete conversation", f"Delete “{self.chat.session.title(conv_id)}” and all its replies?"
        ):
            return
        ops.delete_conversation(self.chat, conv_id)

    def delete_message(self, message_id: int, confirm: bool = True) -> None:
        """Delete a message and everything below it (asked first when something follows it)."""
        if not ops.idle(self.chat):
            return
        if confirm and self.chat.session.has_followers(message_id):
            if not dialogs.confirm(self.parent, "Delete message", "Delete this message and everything that follows it?"):
                return
        ops.delete_message(self.chat, message_id)

    def export_current(self) -> None:
        if self.current is not None:
            self.export(self.current)

    def export(self, conv_id: int) -> None:
        path = dialogs.export_path(self.parent, self.chat.session.title(conv_id), self.qsettings)
        if not path:
            return
        try:
            text = self.chat.session.export(conv_id, as_json=path.endswith(".json"), model=self.chat.link.identity())
            Path(path).write_text(text, encoding="utf-8")
        except (OSError, StoreError) as e:
            self.chat.notices.error("Export failed", str(e))
            return
        self.chat.notices.status(f"Exported to {path}", 4000)

    def import_(self) -> None:
        path = dialogs.import_path(self.parent, self.qsettings)
        if not path:
            return
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            self.chat.notices.error("Import failed", str(e))
            return
        ops.import_conversation(self.chat, path, data)
