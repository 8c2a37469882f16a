"""One message of the conversation: its rendered text (MessageBody) and the widget around it
(MessageWidget: role line with navigator and actions, body, editor, footer, identity badge and
the inspector's buttons). The list of them is app/qt/conversation/chat_view.py."""

from __future__ import annotations

import math
from typing import Optional

from PySide6.QtCore import QEvent, QRect, QSize, Qt, QUrl, Signal
from PySide6.QtGui import (
    QColor,
    QDesktopServices,
    QGuiApplication,
    QKeyEvent,
    QTextCharFormat,
    QTextCursor,
    QTextOption,
)
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core.conversation.markdown import Palette, Rendered, render
from app.core.generation.prefill_rate import PrefillRate
from app.core.generation.replay import Replay
from app.core.conversation.search_marks import term_spans
from app.core.conversation.view_models import MessageVM
from app.qt.composer.attachment_bar import ChipList, document_chips
from app.qt.conversation.runs_button import RunsButton
from app.qt.conversation.scroll_keys import scrolls_the_conversation
from app.qt.widgets.wrap_label import WrapLabel


MARK_COLOR = "#ffd84d"  # a search's words, as the sidebar marks them (app/core/conversation/search_marks.py)
HIT_COLOR = "#ff9632"  # the hit itself: the first match, the line brought into view


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
        self.marks: list[str] = []  # a search's words, marked in the text (set_marks)

    def set_marks(self, terms: list[str]) -> None:
        """Mark each match of `terms` in the text shown (a search hit), over the rendered text:
        extra selections, so the rendering itself is untouched; [] clears them. The first
        match is the hit (the line the view brings into view: `hit_line`), marked stronger, as
        a browser's find marks the current match."""
        self.marks = list(terms)
        selections = []
        for i, (a, b) in enumerate(term_spans(self.toPlainText(), self.marks)):
            fmt = QTextCharFormat()
            fmt.setBackground(QColor(HIT_COLOR if i == 0 else MARK_COLOR))
            fmt.setForeground(QColor("#000000"))
            sel = QTextBrowser.ExtraSelection()
            cursor = QTextCursor(self.document())
            cursor.setPosition(a)
            cursor.setPosition(b, QTextCursor.MoveMode.KeepAnchor)
            sel.cursor, sel.format = cursor, fmt
            selections.append(sel)
        self.setExtraSelections(selections)

    def hit_line(self) -> Optional[QRect]:
        """The line of the first match marked, in the viewport's coordinates (None: none)."""
        selections = self.extraSelections()
        if not selections:
            return None
        cursor = QTextCursor(selections[0].cursor)
        cursor.setPosition(cursor.selectionStart())
        return self.cursorRect(cursor)

    def marked(self) -> list[str]:
        """The texts marked now (what a test reads)."""
        return [sel.cursor.selectedText() for sel in self.extraSelections()]

    def loadResource(self, type: int, name: QUrl) -> object:  # noqa: A002 (Qt's signature)
        return None  # model output must never make the app fetch anything, local or remote

    def set_rendered(self, rendered: Rendered) -> None:
        self.code_blocks = rendered.code_blocks
        self.setHtml(rendered.html)
        if self.marks:  # the new text's matches (the old selections were in the old text)
            self.set_marks(self.marks)
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

    def keyPressEvent(self, event: QKeyEvent) -> None:  # type: ignore[override]
        if scrolls_the_conversation(event):
            event.ignore()  # up to the conversation (ChatView.keyPressEvent), as a page's text does
            return
        super().keyPressEvent(event)

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
    compareRequested = Signal(int)  # the determinism inspector (app/qt/inspector/inspector.py)
    tokensToggled = Signal(int, bool)
    receiptRequested = Signal(int)
    continueRequested = Signal(int)  # a stopped reply (or one at max tokens): go on with it
    regenerateRequested = Signal(int)  # this reply, regenerated (its own seed and settings)
    documentRemoved = Signal(int, int)  # message id, index: a file taken off a message no reply answers

    def __init__(self, vm: MessageVM, palette: Palette, assistant_name: str = "Assistant") -> None:
        super().__init__()
        self.vm = vm
        self.palette_ = palette
        self.assistant_name = assistant_name
        self.streaming = False
        self.stream_text = ""
        self._prefill: Optional[PrefillRate] = None  # the rate of the prefill in progress
        self.replay: Optional[Replay] = None  # a regenerate shown at once, verified as it streams
        self._replay_shown: Optional[tuple[str, object, bool]] = None  # what the body shows of it
        self._shown: tuple[str, str, bool] = ("", "", True)  # what the body shows now
        self.setObjectName("userMessage" if vm.role == "user" else "assistantMessage")
        self.setProperty("selected", False)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(14, 8, 14, 8)
        lay.setSpacing(4)

        # The role line; a name too long for it (a model's) goes on a line of its own above the
        # buttons, whole (_place_name), so the buttons stay in view and no name is cut.
        head = QHBoxLayout()
        head.setSpacing(2)
        self._head, self._name_line, self._name_inline = head, QVBoxLayout(), None
        self._name_line.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(self._name_line)
        self.role_label = WrapLabel("", self)
        self.role_label.setObjectName("roleLabel")
        self.prev_button = _tool("‹", "Previous variant", "prevVariant")
        self.nav_label = QLabel()
        self.nav_label.setObjectName("variantLabel")
        self.next_button = _tool("›", "Next variant", "nextVariant")
        for w in (self.prev_button, self.nav_label, self.next_button):
            head.addWidget(w)
        head.addStretch(1)
        self.edit_button = _tool("Edit", "Edit this message as a new branch", "editButton")
        # A reply's own Regenerate, where Edit is on a user message (the row is as wide).
        self.regen_button = _tool("↻", "Regenerate this reply: its own seed and settings, so it comes out "
                                  "the same (the button under the chat acts on the selected reply)", "replyRegenerate")
        self.copy_button = _tool("Copy", "Copy this message", "copyButton")
        self.delete_button = _tool("Delete", "Delete this message and everything after it", "deleteButton")
        for w in (self.edit_button, self.regen_button, self.copy_button, self.delete_button):
            head.addWidget(w)
        lay.addLayout(head)

        self.doc_chips = ChipList(removable=False, parent=self)  # a user message's attached files
        self.doc_chips.removed.connect(lambda i: self.documentRemoved.emit(self.vm.id, i))
        lay.addWidget(self.doc_chips)
        self._docs_shown: tuple[tuple[str, ...], bool] = ((), False)

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

        # The footer and the identity badge: each in the row of the inspector buttons when it
        # fits there, else on a line of its own above them, wrapped when even that is too narrow
        # (WrapLabel: as tall as its wrapped text). Never elided: no row is wider than the
        # viewport, and no text is cut (_place_footer).
        foot = QHBoxLayout()
        self.footer = WrapLabel("", self)  # parented now: shown before it is placed, never a window
        self.footer.setObjectName("messageFooter")
        self.footer.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.identity = WrapLabel("", self)
        self.identity.setObjectName("identityBadge")
        self._foot, self._footer_line = foot, QVBoxLayout()
        self._footer_line.setContentsMargins(0, 0, 0, 0)
        self._footer_line.setSpacing(2)
        self._placed: Optional[tuple[bool, bool, bool, bool]] = None
        lay.addLayout(self._footer_line)
        # Continue has a row of its own above the inspector's (shown only on a reply that can go
        # on): the inspector's row is as wide as before, so the message's minimum width is too.
        self._actions = QHBoxLayout()
        self._actions.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(self._actions)
        foot.addStretch(0)  # the spare width when nothing is inline: buttons stay right
        self.runs_button = RunsButton()  # a reply regenerated to the same tokens: its other runs
        self.runs_button.chosen.connect(self.show_run)
        foot.addWidget(self.runs_button)
        # The inspector: per-token view (in place of the body), compare view, receipt.
        self.tokens_button = _tool("Tokens", "Show this reply token by token, coloured by probability", "tokensButton")
        self.tokens_button.setCheckable(True)
        self.compare_button = _tool("Compare", "Compare with another variant or a cold run, token by token",
                                    "compareButton")
        self.receipt_button = _tool("Receipt", "Export a receipt: python -m engine verify FILE replays it",
                                    "receiptButton")
        self.continue_button = _tool(
            "Continue", "Go on with this reply where it stopped: its own seed and settings, so the new tokens are "
            "the ones it would have had if never stopped (exact mode). The cache restores where it stopped: "
            "the next token comes at once, no prompt processing; the rest decodes at the usual speed.",
            "continueButton")
        self.continue_button.clicked.connect(lambda: self.continueRequested.emit(self.vm.id))
        self._actions.addWidget(self.continue_button)
        self._actions.addStretch(1)
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
        self.regen_button.clicked.connect(lambda: self.regenerateRequested.emit(self.vm.id))
        self.cancel_edit.clicked.connect(self.stop_edit)
        self.save_edit.clicked.connect(self._submit_edit)
        self.update_vm(vm, force=True)

    def resizeEvent(self, event: QEvent) -> None:  # type: ignore[override]
        super().resizeEvent(event)
        self._place_name()
        self._place_footer()

    def _room(self) -> int:
        m = self.layout().contentsMargins()
        return self.width() - m.left() - m.right()

    @staticmethod
    def _need(label: QLabel, spacing: int) -> int:
        """The width `label` needs for its text on one line (0: hidden or empty)."""
        if label.isHidden() or not label.text():
            return 0
        frame = label.width() - label.contentsRect().width()  # margins, a style sheet's padding
        return label.fontMetrics().horizontalAdvance(label.text()) + frame + 8 + spacing

    def _place_name(self) -> None:
        """The name first in the role line when it fits beside the buttons, else on its own line
        above them (wrapped when wider than the message)."""
        spacing = max(self._head.spacing(), 0)
        row = sum(w.sizeHint().width() + spacing
                  for w in (self.prev_button, self.nav_label, self.next_button, self.edit_button,
                            self.regen_button, self.copy_button, self.delete_button) if not w.isHidden())  # fmt: skip
        need, room = self._need(self.role_label, spacing), self._room()
        inline = need + row <= room
        if (inline, need > room) != self._name_inline:
            self._name_inline = (inline, need > room)
            self._set_inline(self.role_label, self._head, self._name_line, 0, inline, need > room, True)

    def _place_footer(self) -> None:
        """Footer and badge inline (one row with the buttons) when they fit the width, else on
        lines of their own above it, wrapped when wider than the message. Decided from the width
        and the texts only (never from the current placement): stable."""
        buttons = [w for w in (self.runs_button, self.tokens_button, self.compare_button, self.receipt_button)
                   if not w.isHidden()]  # fmt: skip
        spacing = max(self._foot.spacing(), 0)
        room = self._room()
        foot, badge = self._need(self.footer, spacing), self._need(self.identity, spacing)
        row = sum(w.sizeHint().width() + spacing for w in buttons)
        badge_inline = badge + row <= room
        footer_inline = badge_inline and foot + badge + row <= room
        placed = (footer_inline, badge_inline, foot > room, badge > room)
        if placed != self._placed:
            self._placed = placed
            self._set_inline(self.footer, self._foot, self._footer_line, 0, footer_inline, placed[2], True)
            self._set_inline(self.identity, self._foot, self._footer_line, 1 if footer_inline else 0, badge_inline,
                             placed[3], False)  # fmt: skip

    @staticmethod
    def _set_inline(label: WrapLabel, row: QHBoxLayout, lines: QVBoxLayout, index: int, inline: bool,
                    wrap: bool, first: bool) -> None:  # fmt: skip
        """In `row` at `index`, or on a line of its own in `lines` (the first one, or after those
        there), as wide as its text: one line (a one-line WrapLabel has no minimum width: it is placed so only when
        it fits, and must never hold the message wider); on its own line and still too wide:
        wrapped, the whole width."""
        row.removeWidget(label)
        lines.removeWidget(label)
        label.setWordWrap(wrap and not inline)
        if inline:
            row.insertWidget(index, label)  # the row's stretch takes the spare width
        else:
            left = Qt.AlignmentFlag(0) if label.wordWrap() else Qt.AlignmentFlag.AlignLeft
            lines.insertWidget(0 if first else lines.count(), label, 0, left)

    # -- content -----------------------------------------------------------------------------------
    def update_vm(self, vm: MessageVM, force: bool = False) -> None:
        changed = force or vm != self.vm or self._shown != (vm.content, vm.status, False)
        self.vm = vm
        # Its files (compared by digest: a MessageVM's equality leaves their text out).
        shown = (tuple(d.digest for d in vm.documents), vm.unanswered)
        if shown != self._docs_shown:
            self._docs_shown = shown
            self.doc_chips.removable = vm.unanswered  # no reply uses them yet: a file can be taken off
            self.doc_chips.set_chips(document_chips(vm.documents))
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
        self.regen_button.setVisible(is_reply and vm.status != "generating")
        self.footer.setVisible(is_reply and bool(vm.footer))
        self.footer.setText(vm.footer)
        self.footer.setToolTip(vm.settings_note)
        self.runs_button.set_runs(vm.run_lines, vm.shown)
        inspectable = is_reply and vm.tokens > 0 and vm.status != "generating"
        for w in (self.tokens_button, self.compare_button, self.receipt_button):
            w.setVisible(inspectable)
        self.continue_button.setVisible(inspectable and vm.continuable)
        if not inspectable and self.tokens_button.isChecked():
            self.tokens_button.setChecked(False)
        self.identity.setVisible(bool(vm.identity))
        self.identity.setText(vm.badge)
        self._place_name()
        self._place_footer()
        self._set_badge(vm.badge_state)
        if self.replay is not None:  # re-checked: its own badge, not the placeholder's (none)
            self._show_replay(self.replay)
        elif vm.status == "generating" and not self.streaming:
            self.set_stream("", 0)
        elif not self.streaming and self._shown != (vm.content, vm.status, False):
            # Only when the text changed: a new sibling elsewhere only changes the navigator.
            self._render(vm.content)
            self._shown = (vm.content, vm.status, False)

    def _set_badge(self, state: str) -> None:
        self.identity.setProperty("state", state)
        self.identity.style().unpolish(self.identity)
        self.identity.style().polish(self.identity)

    def show_tokens(self, tokens: list[int], pieces: Optional[list[str]], logprobs: list[float]) -> None:
        """The per-token view in place of the rendered text (app/qt/conversation/token_view.py)."""
        from app.qt.conversation.token_view import TokenView

        if self.token_view is None:
            self.token_view = TokenView()
            self.layout().insertWidget(self.layout().indexOf(self.body) + 1, self.token_view)
        self.token_view.set_tokens(tokens, pieces, logprobs)  # type: ignore[attr-defined]  # as tall as its text
        self.body.setVisible(False)
        self.token_view.setVisible(True)

    def hide_tokens(self) -> None:
        if self.token_view is not None:
            self.token_view.setVisible(False)
        self.body.setVisible(True)

    def show_run(self, k: int, line: str) -> None:
        """Run `k` (0: the first) in the footer; the debug panel is asked to show it too."""
        self.footer.setText(line)
        self._place_footer()
        self.runChosen.emit(self.vm.id, k)

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
        if self.replay is not None:  # the replay shows it (set_replay, once a batch too)
            return
        self._shown = (text, "generating", True)
        if text:
            self._render(text, streaming=True)
            self.footer.setText(f"{count} tokens…")
        else:
            self.body.set_rendered(Rendered(f"<p style='color:{self.palette_.muted}'><i>Thinking…</i></p>"))
            self.footer.setText("waiting for the model…")
        self.footer.setVisible(True)
        self._place_footer()

    def set_prefill(self, done: int, total: int) -> str:
        """Prefill progress with its rate and time left (app/core/generation/prefill_rate.py); the line shown."""
        if self._prefill is None:
            self._prefill = PrefillRate()
        line = self._prefill.update(done, total)
        if not self.stream_text and self.replay is None:  # a replay keeps the reply in view
            self.body.set_rendered(Rendered(f"<p style='color:{self.palette_.muted}'><i>{line}</i></p>"))
            self.footer.setText("prefill")
            self._place_footer()
        return line

    def end_stream(self) -> None:
        self.streaming = False
        self._prefill = None
        self.replay, self._replay_shown = None, None

    # -- a regenerate expected to repeat the reply (app/core/generation/replay.py) ----------------------------
    def set_replay(self, replay: Replay) -> None:
        """Show the previous reply's text at once, marked as re-checked, with the count verified
        so far; once the recomputation parts from it, the place is marked and the new text follows."""
        self.replay = replay
        self.streaming = True
        self._show_replay(replay)

    def _show_replay(self, replay: Replay) -> None:
        d = replay.departure
        shown = (replay.shown_text, d, replay.ended)
        if shown != self._replay_shown:  # the text only when it changed: verifying changes the count
            self._replay_shown = shown
            if d is None:
                self._render(replay.expected.text)
            else:
                self._render_parted(replay.text, d.chars, d.index, streaming=not replay.ended)
        self.identity.setText(replay.badge)
        self.identity.setToolTip("Regenerate repeats the reply with its own seed and settings. Its text is shown at "
                                 "once from the previous run; the engine recomputes it (at decode speed) and each "
                                 "token is checked against it, bit for bit.")
        self.identity.setVisible(True)
        self._set_badge(replay.state)
        # The badge counts what is verified ("re-checking… verified 120 / 300"): the footer says how.
        self.footer.setText("recomputing at decode speed…" if not replay.ended else f"{replay.seen} tokens recomputed")
        self.footer.setVisible(True)
        self._place_footer()

    def _render_parted(self, text: str, chars: int, index: int, streaming: bool) -> None:
        """The text both replies share, a mark where they part (as Compare marks the first
        differing token), and the recomputed text from there on."""
        head = render(text[:chars], self.palette_).html if text[:chars].strip() else ""
        tail = render(text[chars:], self.palette_, streaming=streaming)
        mark = (f"<p id='partsHere' style='color:#cf222e'><b>── parts here, at token {index}: the recomputed "
                "reply from here on ──</b></p>")
        # No Copy for the code blocks meanwhile (two renders number them each from 0); the
        # reply as saved has them once it ends.
        self.body.set_rendered(Rendered(head + mark + tail.html, []))

    # -- actions ---------------------------------------------------------------------------------
    def text(self) -> str:
        """The text shown now (streamed text while streaming)."""
        if self.replay is not None:
            return self.replay.shown_text
        return self.stream_text if self.streaming else self.vm.content

    def _copy(self) -> None:
        QGuiApplication.clipboard().setText(self.text())
        self.copied.emit("Message copied")

    @property
    def editing(self) -> bool:
        """Its editor is open (also while the message is out of the built window, hidden with it)."""
        return not self.editor.isHidden()

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
