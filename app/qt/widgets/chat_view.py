"""The conversation: one widget per message of the active path, streaming into the last one.

`set_messages` diffs by message id and re-renders only what changed, so finishing a reply or
switching a variant does not re-render a long conversation. Streaming text arrives already
batched by the chat model (app/core/chat.py); each batch re-renders only the streaming message.
"""

from __future__ import annotations

import math
from typing import Optional

from PySide6.QtCore import QEvent, QSize, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication, QTextOption
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core.markdown import Palette, Rendered, render
from app.core.view_models import MessageVM
from app.qt.widgets.elided_label import ElidedLabel
from app.qt.widgets.runs_button import RunsButton


class MessageBody(QTextBrowser):
    """Rich text that is exactly as tall as its content and never loads a resource."""

    copyCode = Signal(str)

    def __init__(self, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.setObjectName("messageBody")
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        self.viewport().setAutoFillBackground(False)
        self.document().setDocumentMargin(2)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)
        self.anchorClicked.connect(self._on_anchor)
        self.code_blocks: list[str] = []

    def loadResource(self, type: int, name: QUrl) -> object:  # noqa: A002 (Qt's signature)
        return None  # model output must never make the app fetch anything, local or remote

    def set_rendered(self, rendered: Rendered) -> None:
        self.code_blocks = rendered.code_blocks
        self.setHtml(rendered.html)
        self._fit()

    def resizeEvent(self, event: QEvent) -> None:  # type: ignore[override]
        super().resizeEvent(event)
        self.document().setTextWidth(self.viewport().width())
        self._fit()

    def _fit(self, *_: object) -> None:
        h = math.ceil(self.document().size().height()) + 2
        if h != self.height():
            self.setFixedHeight(h)

    def sizeHint(self) -> QSize:
        return QSize(400, self.height())

    def wheelEvent(self, event: QEvent) -> None:  # type: ignore[override]
        event.ignore()  # let the conversation scroll, not this (unscrollable) view

    def _on_anchor(self, url: QUrl) -> None:
        if url.scheme() == "copy":
            try:
                code = self.code_blocks[int(url.path())]
            except (ValueError, IndexError):
                return
            QGuiApplication.clipboard().setText(code)
            self.copyCode.emit(code)
        elif url.scheme() in ("http", "https", "mailto"):
            QDesktopServices.openUrl(url)  # only on an explicit click


def _tool(text: str, tip: str, name: str) -> QToolButton:
    b = QToolButton()
    b.setText(text)
    b.setToolTip(tip)
    b.setObjectName(name)
    b.setAutoRaise(True)
    b.setCursor(Qt.CursorShape.PointingHandCursor)
    return b


class MessageWidget(QFrame):
    """One message: role line with navigator and actions, body, footer (assistant replies)."""

    selected = Signal(int)
    runChosen = Signal(int, int)  # reply id, run index (0: the first): show that run
    navigate = Signal(int)  # sibling id to make active
    editSubmitted = Signal(int, str)
    deleteRequested = Signal(int)
    copied = Signal(str)
    compareRequested = Signal(int)  # the determinism inspector (app/qt/inspector.py)
    tokensToggled = Signal(int, bool)
    receiptRequested = Signal(int)

    def __init__(self, vm: MessageVM, palette: Palette, assistant_name: str = "Assistant") -> None:
        super().__init__()
        self.vm = vm
        self.palette_ = palette
        self.assistant_name = assistant_name
        self.streaming = False
        self.stream_text = ""
        self._shown: tuple[str, str, bool] = ("", "", True)  # what the body shows now
        self.setObjectName("userMessage" if vm.role == "user" else "assistantMessage")
        self.setProperty("selected", False)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(14, 8, 14, 8)
        lay.setSpacing(4)

        head = QHBoxLayout()
        head.setSpacing(2)
        self.role_label = ElidedLabel()  # a long model name elides: the buttons stay in view
        self.role_label.setObjectName("roleLabel")
        head.addWidget(self.role_label)
        self.prev_button = _tool("‹", "Previous variant", "prevVariant")
        self.nav_label = QLabel()
        self.nav_label.setObjectName("variantLabel")
        self.next_button = _tool("›", "Next variant", "nextVariant")
        for w in (self.prev_button, self.nav_label, self.next_button):
            head.addWidget(w)
        head.addStretch(1)
        self.edit_button = _tool("Edit", "Edit this message as a new branch", "editButton")
        self.copy_button = _tool("Copy", "Copy this message", "copyButton")
        self.delete_button = _tool("Delete", "Delete this message and everything after it", "deleteButton")
        for w in (self.edit_button, self.copy_button, self.delete_button):
            head.addWidget(w)
        lay.addLayout(head)

        self.body = MessageBody()
        self.body.copyCode.connect(lambda code: self.copied.emit("Code block copied"))
        self.body.viewport().installEventFilter(self)  # a click on the text selects the reply too
        lay.addWidget(self.body)

        self.editor = QPlainTextEdit()
        self.editor.setObjectName("messageEditor")
        self.editor.setVisible(False)
        self.edit_bar = QWidget()
        eb = QHBoxLayout(self.edit_bar)
        eb.setContentsMargins(0, 0, 0, 0)
        eb.addStretch(1)
        self.cancel_edit = QPushButton("Cancel")
        self.save_edit = QPushButton("Save && send")
        self.save_edit.setObjectName("saveEditButton")
        eb.addWidget(self.cancel_edit)
        eb.addWidget(self.save_edit)
        self.edit_bar.setVisible(False)
        lay.addWidget(self.editor)
        lay.addWidget(self.edit_bar)

        foot = QHBoxLayout()
        self.footer = QLabel()
        self.footer.setObjectName("messageFooter")
        self.footer.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        # Width: the footer sits in the row of the badge and the inspector buttons when it fits
        # there, else on a line of its own above them, where it wraps; the badge elides (tooltip:
        # the whole badge). No row is wider than the viewport (_place_footer).
        self.footer.setWordWrap(True)
        self._foot, self._footer_line, self._footer_inline = foot, QVBoxLayout(), True
        self._footer_line.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(self._footer_line)
        self._set_footer_inline(True)
        self.runs_button = RunsButton()  # a reply regenerated to the same tokens: its other runs
        self.runs_button.chosen.connect(self.show_run)
        foot.addWidget(self.runs_button)
        self.identity = ElidedLabel()
        self.identity.setObjectName("identityBadge")
        foot.addWidget(self.identity, 0, Qt.AlignmentFlag.AlignVCenter)
        foot.addStretch(0)  # the spare width when there is no inline footer: buttons stay right
        # The inspector: per-token view (in place of the body), compare view, receipt.
        self.tokens_button = _tool("Tokens", "Show this reply token by token, coloured by probability", "tokensButton")
        self.tokens_button.setCheckable(True)
        self.compare_button = _tool("Compare", "Compare with another variant or a cold run, token by token",
                                    "compareButton")
        self.receipt_button = _tool("Receipt", "Export a receipt: python -m engine verify FILE replays it",
                                    "receiptButton")
        for w in (self.tokens_button, self.compare_button, self.receipt_button):
            foot.addWidget(w)
        lay.addLayout(foot)
        self.token_view: Optional[QWidget] = None  # created on first use

        self.prev_button.clicked.connect(lambda: self.vm.prev_id and self.navigate.emit(self.vm.prev_id))
        self.next_button.clicked.connect(lambda: self.vm.next_id and self.navigate.emit(self.vm.next_id))
        self.copy_button.clicked.connect(self._copy)
        self.tokens_button.toggled.connect(lambda on: self.tokensToggled.emit(self.vm.id, on))
        self.compare_button.clicked.connect(lambda: self.compareRequested.emit(self.vm.id))
        self.receipt_button.clicked.connect(lambda: self.receiptRequested.emit(self.vm.id))
        self.delete_button.clicked.connect(lambda: self.deleteRequested.emit(self.vm.id))
        self.edit_button.clicked.connect(self.start_edit)
        self.cancel_edit.clicked.connect(self.stop_edit)
        self.save_edit.clicked.connect(self._submit_edit)
        self.update_vm(vm, force=True)

    def resizeEvent(self, event: QEvent) -> None:  # type: ignore[override]
        super().resizeEvent(event)
        self._place_footer()

    def _place_footer(self) -> None:
        """The footer inline (one row with the badge and buttons) when all of it fits the width,
        else on its own line above them. Decided from the width and the texts only: stable."""
        row = [w for w in (self.runs_button, self.identity, self.tokens_button, self.compare_button, self.receipt_button)
               if not w.isHidden()]  # fmt: skip
        spacing = max(self._foot.spacing(), 0)
        text = self.footer.fontMetrics().horizontalAdvance(self.footer.text()) + 8
        m = self.layout().contentsMargins()
        room = self.width() - m.left() - m.right()
        inline = self.footer.isHidden() or text + sum(w.sizeHint().width() + spacing for w in row) <= room
        wrap = not inline and text > room
        if (inline, wrap) != (self._footer_inline, self.footer.wordWrap()):
            self._set_footer_inline(inline, wrap)

    def _set_footer_inline(self, inline: bool, wrap: bool = False) -> None:
        """Inline: one line, all the row's spare width, no minimum (it is inline only when it
        fits, and must never hold the message wider); on its own line: one line, or wrapped
        when even that is too narrow."""
        self._footer_inline = inline
        self._foot.removeWidget(self.footer)
        self._footer_line.removeWidget(self.footer)
        self.footer.setWordWrap(wrap)
        horizontal = QSizePolicy.Policy.Ignored if inline or not wrap else QSizePolicy.Policy.Preferred
        self.footer.setSizePolicy(horizontal, QSizePolicy.Policy.Preferred)
        if inline:
            self._foot.insertWidget(0, self.footer, 1)
        else:
            self._footer_line.addWidget(self.footer)

    # -- content -----------------------------------------------------------------------------------
    def update_vm(self, vm: MessageVM, force: bool = False) -> None:
        changed = force or vm != self.vm or self._shown != (vm.content, vm.status, False)
        self.vm = vm
        if not changed:
            return
        if vm.role == "user":
            self.role_label.setText("You")
        elif vm.role == "assistant":
            self.role_label.setText(vm.model_name or self.assistant_name)
        else:
            self.role_label.setText(vm.role.capitalize())
        many = vm.variants > 1
        for w in (self.prev_button, self.nav_label, self.next_button):
            w.setVisible(many)
        self.nav_label.setText(vm.navigator)
        self.prev_button.setEnabled(vm.prev_id is not None)
        self.next_button.setEnabled(vm.next_id is not None)
        self.edit_button.setVisible(vm.role == "user")
        is_reply = vm.role == "assistant"
        self.footer.setVisible(is_reply and bool(vm.footer))
        self.footer.setText(vm.footer)
        self.footer.setToolTip(vm.settings_note)
        self.runs_button.set_runs(vm.run_lines)
        inspectable = is_reply and vm.tokens > 0 and vm.status != "generating"
        for w in (self.tokens_button, self.compare_button, self.receipt_button):
            w.setVisible(inspectable)
        if not inspectable and self.tokens_button.isChecked():
            self.tokens_button.setChecked(False)
        self.identity.setVisible(bool(vm.identity))
        self.identity.setText(vm.badge)
        self._place_footer()
        self.identity.setProperty("state", vm.badge_state)
        self.identity.style().unpolish(self.identity)
        self.identity.style().polish(self.identity)
        if vm.status == "generating" and not self.streaming:
            self.set_stream("", 0)
        elif not self.streaming and self._shown != (vm.content, vm.status, False):
            # Only when the text changed: a new sibling elsewhere only changes the navigator.
            self._render(vm.content)
            self._shown = (vm.content, vm.status, False)

    def show_run(self, k: int, line: str) -> None:
        """Run `k` (0: the first) in the footer; the debug panel is asked to show it too."""
        self.footer.setText(line)
        self._place_footer()
        self.runChosen.emit(self.vm.id, k)

    def show_tokens(self, tokens: list[int], pieces: Optional[list[str]], logprobs: list[float]) -> None:
        """The per-token view in place of the rendered text (app/qt/widgets/token_view.py)."""
        from app.qt.widgets.token_view import TokenView

        if self.token_view is None:
            self.token_view = TokenView()
            self.token_view.setMinimumHeight(120)
            self.layout().insertWidget(self.layout().indexOf(self.body) + 1, self.token_view)
        self.token_view.set_tokens(tokens, pieces, logprobs)  # type: ignore[attr-defined]
        height = int(self.token_view.document().size().height()) + 12  # type: ignore[attr-defined]
        self.token_view.setFixedHeight(min(max(height, 60), 480))
        self.body.setVisible(False)
        self.token_view.setVisible(True)

    def hide_tokens(self) -> None:
        if self.token_view is not None:
            self.token_view.setVisible(False)
        self.body.setVisible(True)

    def _render(self, text: str, streaming: bool = False) -> None:
        if self.vm.role == "user":
            # What the user typed is shown as typed (escaped, no markdown surprises).
            from html import escape

            html = "<p style='white-space:pre-wrap'>" + escape(text) + "</p>"
            self.body.set_rendered(Rendered(html))
            return
        if not text and not streaming:
            note = "Stopped before the first token." if self.vm.status == "interrupted" else ""
            self.body.set_rendered(Rendered(f"<p style='color:{self.palette_.muted}'><i>{note}</i></p>"))
            return
        self.body.set_rendered(render(text, self.palette_, streaming=streaming))

    def set_palette(self, palette: Palette) -> None:
        if palette == self.palette_:
            return
        self.palette_ = palette
        if self.streaming:
            self._render(self.stream_text, streaming=True)
        else:
            self._render(self.vm.content)

    # -- streaming -------------------------------------------------------------------------------
    def set_stream(self, text: str, count: int) -> None:
        self.streaming = True
        self.stream_text = text
        self._shown = (text, "generating", True)
        if text:
            self._render(text, streaming=True)
            self.footer.setText(f"{count} tokens…")
        else:
            self.body.set_rendered(Rendered(f"<p style='color:{self.palette_.muted}'><i>Thinking…</i></p>"))
            self.footer.setText("waiting for the model…")
        self.footer.setVisible(True)
        self._place_footer()

    def set_prefill(self, done: int, total: int) -> None:
        if self.stream_text:
            return
        pct = 100 * done // max(total, 1)
        self.body.set_rendered(
            Rendered(f"<p style='color:{self.palette_.muted}'><i>Reading the prompt… {done} / {total} tokens ({pct}%)</i></p>")
        )
        self.footer.setText("prefill")
        self._place_footer()

    def end_stream(self) -> None:
        self.streaming = False

    # -- actions ---------------------------------------------------------------------------------
    def text(self) -> str:
        """The text shown now (streamed text while streaming)."""
        return self.stream_text if self.streaming else self.vm.content

    def _copy(self) -> None:
        QGuiApplication.clipboard().setText(self.text())
        self.copied.emit("Message copied")

    def start_edit(self) -> None:
        self.editor.setPlainText(self.vm.content)
        self.body.setVisible(False)
        self.editor.setVisible(True)
        self.edit_bar.setVisible(True)
        self.editor.setFocus()

    def stop_edit(self) -> None:
        self.editor.setVisible(False)
        self.edit_bar.setVisible(False)
        self.body.setVisible(True)

    def _submit_edit(self) -> None:
        text = self.editor.toPlainText()
        if text.strip():
            self.stop_edit()
            self.editSubmitted.emit(self.vm.id, text)

    def mousePressEvent(self, event: QEvent) -> None:  # type: ignore[override]
        self.selected.emit(self.vm.id)
        super().mousePressEvent(event)

    def eventFilter(self, watched: object, event: QEvent) -> bool:  # type: ignore[override]
        if watched is self.body.viewport() and event.type() == QEvent.Type.MouseButtonPress:
            self.selected.emit(self.vm.id)
        return False  # the text still gets the click (selection, links)

    def set_flash(self, on: bool) -> None:
        self.setProperty("flash", on)
        self.style().unpolish(self)
        self.style().polish(self)

    def set_selected(self, on: bool) -> None:
        if self.property("selected") != on:
            self.setProperty("selected", on)
            self.style().unpolish(self)
            self.style().polish(self)


class ChatView(QScrollArea):
    selected = Signal(int)
    runChosen = Signal(int, int)
    navigate = Signal(int)
    editSubmitted = Signal(int, str)
    deleteRequested = Signal(int)
    copied = Signal(str)
    compareRequested = Signal(int)
    tokensToggled = Signal(int, bool)
    receiptRequested = Signal(int)

    MAX_WIDTH = 860

    def __init__(self, palette: Palette, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.setObjectName("messageView")
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        # Messages wrap to the viewport (their minimum widths are small); should one still be wider
        # (a very narrow window), a scroll bar keeps it reachable instead of cutting it off.
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.palette_ = palette
        self.assistant_name = "Assistant"
        outer = QWidget()
        outer.setObjectName("messageCanvas")
        row = QHBoxLayout(outer)
        row.setContentsMargins(12, 16, 12, 16)
        self.column = QWidget()
        self.column.setMaximumWidth(self.MAX_WIDTH)
        row.addStretch(1)
        row.addWidget(self.column, 100)
        row.addStretch(1)
        self.col_layout = QVBoxLayout(self.column)
        self.col_layout.setContentsMargins(0, 0, 0, 0)
        self.col_layout.setSpacing(10)
        self.empty = QLabel()
        self.empty.setObjectName("emptyState")
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty.setWordWrap(True)
        self.empty.setText(
            "<h2>Start a conversation</h2><p>Type below and press Enter.<br>"
            "Regenerate (Ctrl+R) gives the same reply, instantly, from the prompt cache.</p>"
        )
        self.col_layout.addWidget(self.empty)
        self.marker = QLabel()  # "12 earlier messages are not sent to the model"
        self.marker.setObjectName("contextMarker")
        self.marker.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.marker.setWordWrap(True)
        self.marker.setVisible(False)
        self.col_layout.addWidget(self.marker)
        self.col_layout.addStretch(1)
        self.setWidget(outer)
        self.widgets: dict[int, MessageWidget] = {}
        self.order: list[int] = []
        self.selected_id: Optional[int] = None
        self._stick = True  # follow the bottom while streaming unless the user scrolled up
        self.verticalScrollBar().rangeChanged.connect(self._on_range)
        self.verticalScrollBar().valueChanged.connect(self._on_scroll)

    # -- messages --------------------------------------------------------------------------------
    def set_messages(self, vms: list[MessageVM], marker: Optional[tuple[int, str]] = None) -> None:
        """Show `vms` in order; `marker` = (index, text): a line before vms[index] saying what
        was left out of the prompt."""
        keep = {vm.id for vm in vms}
        for mid in [m for m in self.widgets if m not in keep]:
            w = self.widgets.pop(mid)
            self.col_layout.removeWidget(w)
            # Hide and detach now: deleteLater waits for the event loop, and until then the old
            # widget would still paint under its replacement.
            w.hide()
            w.setParent(None)
            w.deleteLater()
        items: list[QWidget] = []
        for vm in vms:
            w = self.widgets.get(vm.id)
            if w is None:
                w = MessageWidget(vm, self.palette_, self.assistant_name)
                w.selected.connect(self.select)
                w.runChosen.connect(self.runChosen)
                w.navigate.connect(self.navigate)
                w.editSubmitted.connect(self.editSubmitted)
                w.deleteRequested.connect(self.deleteRequested)
                w.copied.connect(self.copied)
                w.compareRequested.connect(self.compareRequested)
                w.tokensToggled.connect(self.tokensToggled)
                w.receiptRequested.connect(self.receiptRequested)
                self.widgets[vm.id] = w
            else:
                w.update_vm(vm)
            items.append(w)
        if marker is not None:
            items.insert(marker[0], self.marker)
            self.marker.setText(marker[1])
        self.marker.setVisible(marker is not None)
        for i, w in enumerate(items):
            if self.col_layout.indexOf(w) != i + 1:
                self.col_layout.removeWidget(w)
                self.col_layout.insertWidget(i + 1, w)  # index 0 is the empty-state label
        self.order = [vm.id for vm in vms]
        self.empty.setVisible(not vms)
        if self.selected_id not in keep:
            self.selected_id = None
        self._paint_selection()
        self.updateGeometry()  # the minimum width below may have changed

    def minimumSizeHint(self) -> QSize:  # type: ignore[override]
        """Never narrower than its messages can be (their button rows): in a narrow window the
        dock and the sidebar give way, instead of messages being cut off at the viewport's edge."""
        s = super().minimumSizeHint()
        margins = self.widget().layout().contentsMargins()
        need = (self.column.minimumSizeHint().width() + margins.left() + margins.right()
                + self.verticalScrollBar().sizeHint().width() + 2 * self.frameWidth())  # fmt: skip
        return QSize(max(s.width(), need), s.height())

    def message_widgets(self) -> list[MessageWidget]:
        return [self.widgets[i] for i in self.order]

    def widget_for(self, message_id: int) -> Optional[MessageWidget]:
        return self.widgets.get(message_id)

    def select(self, message_id: int) -> None:
        """A click on a message: ask for it (the chat model decides; `show_selected` marks it)."""
        self.selected.emit(message_id)

    def show_selected(self, message_id: Optional[int]) -> None:
        """Mark the reply Regenerate acts on (the chat model's selection), without a signal."""
        self.selected_id = message_id
        self._paint_selection()

    def _paint_selection(self) -> None:
        for mid, w in self.widgets.items():
            w.set_selected(mid == self.selected_id and w.vm.role == "assistant")

    def set_palette(self, palette: Palette) -> None:
        self.palette_ = palette
        for w in self.widgets.values():
            w.set_palette(palette)

    def set_assistant_name(self, name: str) -> None:
        self.assistant_name = name
        for w in self.widgets.values():
            w.assistant_name = name

    # -- streaming -------------------------------------------------------------------------------
    def stream(self, message_id: int, text: str, count: int) -> None:
        w = self.widgets.get(message_id)
        if w is not None:
            w.set_stream(text, count)

    def prefill(self, message_id: int, done: int, total: int) -> None:
        w = self.widgets.get(message_id)
        if w is not None:
            w.set_prefill(done, total)

    def end_stream(self, message_id: int) -> None:
        w = self.widgets.get(message_id)
        if w is not None:
            w.end_stream()

    # -- scrolling -------------------------------------------------------------------------------
    FLASH_MS = 1500

    def reveal(self, message_id: int) -> None:
        """Scroll `message_id` into view and flash it (a search hit)."""
        w = self.widgets.get(message_id)
        if w is None:
            return
        self._stick = False  # a jump up the conversation: do not follow the bottom
        self.widget().layout().activate()  # geometry up to date before scrolling to it
        self.ensureWidgetVisible(w, 0, 40)
        w.set_flash(True)
        QTimer.singleShot(self.FLASH_MS, lambda: message_id in self.widgets and self.widgets[message_id].set_flash(False))

    def scroll_to_bottom(self) -> None:
        self._stick = True
        QTimer.singleShot(0, lambda: self._stick and self.verticalScrollBar().setValue(self.verticalScrollBar().maximum()))

    def _on_range(self, _min: int, maximum: int) -> None:
        if self._stick:
            self.verticalScrollBar().setValue(maximum)

    def _on_scroll(self, value: int) -> None:
        self._stick = value >= self.verticalScrollBar().maximum() - 24
