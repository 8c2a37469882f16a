"""The conversation list: search, new, rename (F2 / double-click), delete (context menu / Del).

Given the window's `Chat`, it binds to the conversation list (app/core/conversation/listing.py:
the items, and the search it runs as typing pauses) and highlights the open conversation; what
the user asks of a conversation (open, new, rename, delete, export) goes out as its signals, to
the conversation actions (app/qt/conversation/actions.py).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Optional

from PySide6.QtCore import QModelIndex, QPoint, QSize, Qt, Signal
from PySide6.QtGui import QAbstractTextDocumentLayout, QKeySequence, QPainter, QPalette, QShortcut, QTextDocument
from PySide6.QtWidgets import (
    QLabel,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from superqt.utils import qdebounced

from app.core.conversation.search_marks import marked_html, search_terms
from app.core.conversation.view_models import ConversationItem

if TYPE_CHECKING:
    from app.core.chat import Chat

SEARCH_DEBOUNCE_MS = 150  # a search starts once typing pauses this long

MARKED_ROLE = Qt.ItemDataRole.UserRole + 2  # a search result's text with its words marked (rich text)


class MarkedDelegate(QStyledItemDelegate):
    """A search result drawn as rich text, the query's words marked in its title and snippet;
    any other row as usual."""

    def _doc(self, option: QStyleOptionViewItem, html: str) -> QTextDocument:
        doc = QTextDocument()
        doc.setDefaultFont(option.font)
        doc.setDocumentMargin(2)
        doc.setHtml(html)
        doc.setTextWidth(max(option.rect.width(), 40))
        return doc

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex) -> None:
        html = index.data(MARKED_ROLE)
        if not html:
            super().paint(painter, option, index)
            return
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        opt.text = ""
        style = opt.widget.style() if opt.widget is not None else None
        if style is not None:
            style.drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, opt.widget)
        doc = self._doc(opt, html)
        ctx = QAbstractTextDocumentLayout.PaintContext()
        # The style sheet draws a selected row in the text colour on a pale selection
        # (resources/styles/app.qss: ::item:selected), not in the palette's HighlightedText
        # (white), which it does not change: the rich text follows the sheet.
        ctx.palette.setColor(QPalette.ColorRole.Text, opt.palette.color(QPalette.ColorRole.Text))
        painter.save()
        painter.translate(opt.rect.topLeft())
        painter.setClipRect(opt.rect.translated(-opt.rect.topLeft()))
        doc.documentLayout().draw(painter, ctx)
        painter.restore()

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex) -> QSize:
        html = index.data(MARKED_ROLE)
        if not html:
            return super().sizeHint(option, index)
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        if opt.widget is not None:
            opt.rect.setWidth(opt.widget.viewport().width())  # type: ignore[attr-defined]
        doc = self._doc(opt, html)
        return QSize(int(doc.idealWidth()), int(doc.size().height()) + 4)


class Sidebar(QWidget):
    selected = Signal(int)
    newRequested = Signal()
    renameRequested = Signal(int)
    deleteRequested = Signal(int)
    exportRequested = Signal(int)
    searchChanged = Signal(str)  # debounced

    def __init__(self, chat: Optional["Chat"] = None, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.setObjectName("sidebar")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 10, 10, 10)
        lay.setSpacing(8)
        self.new_button = QPushButton("+  New chat")
        self.new_button.setObjectName("newChatButton")
        self.new_button.setToolTip("New conversation (Ctrl+N)")
        self.new_button.clicked.connect(self.newRequested)
        lay.addWidget(self.new_button)
        self.search = QLineEdit()
        self.search.setObjectName("conversationSearch")
        self.search.setPlaceholderText("Search conversations")
        self.search.setClearButtonEnabled(True)
        lay.addWidget(self.search)
        self.list = QListWidget()
        self.list.setObjectName("conversationList")
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setUniformItemSizes(False)
        self.list.setWordWrap(True)
        self.list.setItemDelegate(MarkedDelegate(self.list))  # a search's words marked in its results
        self.list.customContextMenuRequested.connect(self._menu)
        self.list.currentItemChanged.connect(self._on_current)
        # A click on the conversation already open (the current row: no change to report) still
        # opens it: its search hit is scrolled to and marked again.
        self.list.itemClicked.connect(lambda it: self.selected.emit(it.data(Qt.ItemDataRole.UserRole)))
        self.list.itemDoubleClicked.connect(lambda it: self.renameRequested.emit(it.data(Qt.ItemDataRole.UserRole)))
        lay.addWidget(self.list, 1)
        # In the list's place when it is empty: "No conversations yet", or what a search found
        # nothing for (wrapped: a long query is shown whole).
        self.empty = QLabel("No conversations yet.")
        self.empty.setObjectName("emptyList")
        self.empty.setWordWrap(True)
        self.empty.setTextFormat(Qt.TextFormat.PlainText)
        self.empty.setAlignment(Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignTop)
        self.empty.setVisible(False)
        lay.addWidget(self.empty, 1)
        # Only while the list has the focus (Delete in the chat or the composer is not "delete
        # this conversation"), and spelled out: QKeySequence.StandardKey.Delete is also Ctrl+D
        # on X11, the debug panel's key. macOS's delete key is Backspace.
        delete_key = Qt.Key.Key_Backspace if sys.platform == "darwin" else Qt.Key.Key_Delete
        for key, requested in ((Qt.Key.Key_F2, self._rename_current), (delete_key, self._delete_current)):
            sc = QShortcut(QKeySequence(key), self.list, requested)
            sc.setContext(Qt.ShortcutContext.WidgetShortcut)
        self._typed = qdebounced(lambda: self.searchChanged.emit(self.search.text().strip()), SEARCH_DEBOUNCE_MS,
                                 parent=self)  # fmt: skip
        self.search.textChanged.connect(lambda _: self._typed())
        self._quiet = False
        if chat is not None:
            self._bind(chat)

    def _bind(self, chat: "Chat") -> None:
        chat.listing.items_changed.connect(lambda items: self.set_items(items, chat.conversation.conv_id))
        chat.conversation.opened.connect(self.set_current)  # also after a restart: the open chat is highlighted
        self.searchChanged.connect(chat.listing.search)

    def focus_search(self) -> None:
        """Ctrl+F: the search field, its text selected to type over."""
        self.search.setFocus(Qt.FocusReason.ShortcutFocusReason)
        self.search.selectAll()

    def stop(self) -> None:
        """The window is closing: a search still waiting for typing to pause is dropped."""
        self._typed.cancel()
        self.search.blockSignals(True)

    def set_items(self, items: list[ConversationItem], current: Optional[int]) -> None:
        self._quiet = True  # repopulating is not the user choosing a conversation
        terms = self.terms()
        try:
            self.list.clear()
            for it in items:
                item = QListWidgetItem(it.title if not it.subtitle else f"{it.title}\n{it.subtitle}")
                item.setData(Qt.ItemDataRole.UserRole, it.id)
                item.setData(self.HIT_ROLE, it.hit_id)
                if terms:  # search results: the words found, marked
                    parts = [marked_html(it.title, terms)] + ([marked_html(it.subtitle, terms)] if it.subtitle else [])
                    item.setData(MARKED_ROLE, "<br>".join(parts))
                item.setToolTip(it.title)
                self.list.addItem(item)
                if it.id == current:
                    self.list.setCurrentItem(item)
        finally:
            self._quiet = False
        query = self.search.text().strip()
        self.list.setVisible(bool(items))
        self.empty.setVisible(not items)
        self.empty.setText(f"No conversations match “{query}”." if query else "No conversations yet.")

    HIT_ROLE = Qt.ItemDataRole.UserRole + 1

    def terms(self) -> list[str]:
        """The words of the search typed (none: no search)."""
        return search_terms(self.search.text().strip())

    def hit_for(self, conv_id: int) -> Optional[int]:
        """The search hit's message in conversation `conv_id`, if the list shows search results."""
        for i in range(self.list.count()):
            item = self.list.item(i)
            if item.data(Qt.ItemDataRole.UserRole) == conv_id:
                return item.data(self.HIT_ROLE)
        return None

    def set_current(self, conv_id: Optional[int]) -> None:
        """Highlight the conversation shown (quietly: the window already shows it)."""
        self._quiet = True
        try:
            row = self.ids().index(conv_id) if conv_id in self.ids() else -1
            if row >= 0:
                self.list.setCurrentRow(row)
            else:
                self.list.setCurrentItem(None)
        finally:
            self._quiet = False

    def current_id(self) -> Optional[int]:
        it = self.list.currentItem()
        return it.data(Qt.ItemDataRole.UserRole) if it is not None else None

    def ids(self) -> list[int]:
        return [self.list.item(i).data(Qt.ItemDataRole.UserRole) for i in range(self.list.count())]

    def _on_current(self, item: Optional[QListWidgetItem], _prev: Optional[QListWidgetItem]) -> None:
        if item is not None and not self._quiet:
            self.selected.emit(item.data(Qt.ItemDataRole.UserRole))

    def _rename_current(self) -> None:
        cid = self.current_id()
        if cid is not None:
            self.renameRequested.emit(cid)

    def _delete_current(self) -> None:
        cid = self.current_id()
        if cid is not None:
            self.deleteRequested.emit(cid)

    def _menu(self, pos: QPoint) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        cid = item.data(Qt.ItemDataRole.UserRole)
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self.renameRequested.emit(cid))
        menu.addAction("Export…", lambda: self.exportRequested.emit(cid))
        menu.addSeparator()
        menu.addAction("Delete", lambda: self.deleteRequested.emit(cid))
        menu.exec(self.list.mapToGlobal(pos))
