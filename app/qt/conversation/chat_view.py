"""The conversation: the messages of the active path, streaming into the last one.

Only the messages near the viewport have a widget (`MessageWidget`, ~0.5 MB each): a window of
at least WINDOW_MIN messages reaching MARGIN_PX beyond each edge of the viewport, between two
spacers as tall as the messages outside it (their measured height at this width, else an
estimate from their text). Scrolling moves the window, keeping the message at the top of the
viewport where it was; a conversation of 2,000 messages opens as fast as one of 40
(docs/benchmarks.md). A widget showing state of its own (streaming, editing, its tokens, the
selection) is kept while it is outside the window, hidden, and shown again when it returns.
`widget_for(id)` builds a message's widget and scrolls it into view.

`set_messages` diffs by message id and re-renders only what changed, so finishing a reply or
switching a variant does not re-render a long conversation. Streaming text arrives already
batched by the generation (app/core/generation/model.py); each batch re-renders only the
streaming message. One message's widget is app/qt/conversation/message_widget.py.

Given the window's `Chat`, the view binds to the open conversation (its path and selection) and
the generation (the reply streaming into it), reads the selection and the stream from them when
it builds a widget (no copies kept here), and sends what the user does as operations
(app/core/ops.py): a click selects, ‹ › switches variant, Edit branches, ↻ regenerates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import shiboken6
from PySide6.QtCore import QEvent, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QApplication, QFrame, QHBoxLayout, QLabel, QScrollArea, QVBoxLayout, QWidget

from app.core import ops
from app.core.conversation.markdown import Palette
from app.core.conversation.view_models import MessageVM, context_marker
from app.core.generation.replay import Replay
from app.core.store import Action
from app.qt import dialogs
from app.qt.conversation.message_widget import MessageBody, MessageWidget
from app.qt.conversation.scroll_keys import scrolls_the_conversation

if TYPE_CHECKING:
    from app.core.chat import Chat
    from app.core.store.session import PendingReply

__all__ = ["ChatView", "MessageBody", "MessageWidget"]

VIRTUALIZE = True  # False builds every message's widget (the mutation check's switch; not a setting)
WINDOW_MIN = 60  # messages always built around the viewport: a chat this short has all of them
MARGIN_PX = 1200  # built beyond the viewport's top and bottom edges
SPACING = 10  # between messages


def estimate_height(vm: MessageVM, width: int) -> int:
    """A message's height before it was ever built: its text's lines at this width, plus the
    role line and, for a reply, the footer. Off by some pixels; the spacers absorb that."""
    per_line = max(20, (max(width, 200) - 40) // 8)  # characters per line at ~8 px a character
    lines = sum(1 + len(line) // per_line for line in (vm.content or "").split("\n"))
    return 40 + 20 * lines + (44 if vm.role == "assistant" else 0)


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
    continueRequested = Signal(int)
    regenerateRequested = Signal(int)
    documentRemoved = Signal(int, int)

    MAX_WIDTH = 860

    def __init__(self, palette: Palette, chat: Optional["Chat"] = None, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.chat = chat
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
        self.col_layout.setSpacing(SPACING)
        self.empty = QLabel()
        self.empty.setObjectName("emptyState")
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty.setWordWrap(True)
        self.empty.setText(
            "<h2>Start a conversation</h2><p>Type below and press Enter.<br>"
            "Regenerate (Ctrl+R) gives the same reply: shown at once from the previous run, its first token "
            "with no prompt processing (the prompt cache), then verified token by token as it is recomputed "
            "at decode speed.</p>"
        )
        self.col_layout.addWidget(self.empty)
        self.marker = QLabel()  # "12 earlier messages are not sent to the model"
        self.marker.setObjectName("contextMarker")
        self.marker.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.marker.setWordWrap(True)
        self.marker.setVisible(False)
        # The messages outside the window: two spacers as tall as they are.
        self.top_pad, self.bottom_pad = QWidget(), QWidget()
        for pad in (self.top_pad, self.bottom_pad):
            pad.setFixedHeight(0)
            self.col_layout.addWidget(pad)
        self.col_layout.addStretch(1)
        self.setWidget(outer)
        self.vms: list[MessageVM] = []  # the active path
        self.widgets: dict[int, MessageWidget] = {}  # built: the window, and kept ones outside it
        self.order: list[int] = []
        self.lo, self.hi = 0, 0  # the window: vms[lo:hi] are in the layout
        self.heights: dict[tuple[int, str, int], int] = {}  # (id, text, width) -> measured height
        self._marker: Optional[tuple[int, str]] = None
        self._stick = True  # follow the bottom while streaming unless the user scrolled up
        # Empty canvas under the last message: room for a message kept where it was on screen
        # when the path now ends soon after it (a regenerate, a variant with no later turns). It
        # shrinks as the path grows into it and as the user scrolls up (never scrolled into).
        self._slack = 0
        self._bottom = 0  # the bottom spacer's height for the messages below the window
        self._revealing: Optional[int] = None  # a search hit kept in view while the layout settles
        self.mark: Optional[tuple[int, list[str]]] = None  # a search hit and its words, marked until the next action
        self._moving = False  # the window is being moved: scroll changes are its own
        self._pin: Optional[tuple[int, int]] = None  # the message kept in place as heights settle
        self._move_queued = False
        self.verticalScrollBar().rangeChanged.connect(self._on_range)
        self.verticalScrollBar().valueChanged.connect(self._on_scroll)
        if chat is not None:
            self._bind(chat)

    # -- the chat it shows -----------------------------------------------------------------------
    def _bind(self, chat: "Chat") -> None:
        conv, gen = chat.conversation, chat.generation
        conv.path_changed.connect(self._show_path)
        conv.selected_changed.connect(lambda vm: self._paint_selection())
        conv.opened.connect(lambda _: self.scroll_to_bottom())
        gen.started.connect(self._started)
        gen.ended.connect(lambda pending: self.end_stream(pending.reply_id))
        gen.streamed.connect(self.stream)
        gen.replayed.connect(self.replay)
        gen.prefilled.connect(self._prefilled)
        chat.link.loaded.connect(lambda spec, name, info: self.set_assistant_name(name))
        chat.listing.searched.connect(lambda _: self.clear_mark())
        chat.composer.text_changed.connect(lambda _: self.clear_mark())  # typing: the next action after a search
        self.selected.connect(conv.select)
        self.runChosen.connect(conv.show_run)
        self.navigate.connect(lambda mid: ops.switch_variant(chat, mid))
        self.editSubmitted.connect(lambda mid, text: ops.edit(chat, mid, text))
        self.deleteRequested.connect(self._delete)
        self.continueRequested.connect(lambda mid: ops.continue_reply(chat, mid))
        self.regenerateRequested.connect(lambda mid: ops.regenerate_reply(chat, mid))
        self.documentRemoved.connect(lambda mid, i: ops.remove_document(chat, mid, i))
        self.copied.connect(lambda msg: chat.notices.status(msg, 2000))

    @property
    def selected_id(self) -> Optional[int]:
        """The reply Regenerate acts on (the conversation's selection), marked in the view."""
        vm = self.chat.conversation.selected if self.chat is not None else None
        return vm.id if vm is not None else None

    def _streaming(self) -> Optional["PendingReply"]:
        """The reply streaming into this conversation, if any."""
        pending = self.chat.generation.pending if self.chat is not None else None
        return pending if pending is not None and pending.reply_id in self.order else None

    def _show_path(self, vms: list[MessageVM]) -> None:
        self.set_messages(vms, context_marker(vms))
        pending = self._streaming()
        if pending is not None:
            s = self.chat.generation.stream  # type: ignore[union-attr]
            self.stream(pending.reply_id, s.text, s.tokens)

    def _started(self, pending: "PendingReply") -> None:
        """A reply started: a new message's at the end is followed there; a regenerate, a new
        variant, a Continue or an edit keeps the reply where it is on screen (set_messages)."""
        if pending.action in (Action.SEND, Action.RETRY):
            self.scroll_to_bottom()
        else:
            self.clear_mark()  # the next action after a search

    def _prefilled(self, reply_id: int, done: int, total: int) -> None:
        line = self.prefill(reply_id, done, total)  # with its rate and time left
        if self.chat is not None:
            self.chat.notices.status(line or f"Reading the prompt: {done:,} / {total:,}")

    def _delete(self, message_id: int) -> None:
        """Delete a message and what follows it (asked first when something does)."""
        chat = self.chat
        if chat is None or not ops.idle(chat):
            return
        if chat.session.has_followers(message_id) and not dialogs.confirm(
                self, "Delete message", "Delete this message and everything that follows it?"):
            return
        ops.delete_message(chat, message_id)

    # -- messages --------------------------------------------------------------------------------
    def set_messages(self, vms: list[MessageVM], marker: Optional[tuple[int, str]] = None) -> None:
        """Show `vms` in order; `marker` = (index, text): a line before vms[index] saying what
        was left out of the prompt."""
        keep = {vm.id for vm in vms}
        new = [vm.id for vm in vms]
        old = self.order
        d = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
        anchor = self._anchor()
        # A message replaced (a variant, a regenerate, an edit) stays where it was on screen;
        # one added at the end is followed there when the view follows the bottom.
        cut = d == len(new) < len(old)  # the path cut at its end (a delete, a failed reply's placeholder gone)
        if anchor is not None and old[:1] == new[:1] and (d < len(old) or not self._stick) and not cut:
            anchor = self._kept_in_place(anchor, d, new)
        else:  # a conversation opened (at its end, as the window shows it), following the bottom, or
            anchor = None  # a path cut at its end: the end is shown (no slack holds what was above it)
        self.vms, self.order, self._marker = list(vms), new, marker
        for mid in [m for m in self.widgets if m not in keep]:
            self._drop(mid)
        for vm in vms:
            w = self.widgets.get(vm.id)
            if w is not None:
                w.update_vm(vm)
        if anchor is not None:
            self._place(self._window_at(self.order.index(anchor[0])), anchor)
        else:
            self._place(self._window_at(len(vms) - 1))
        self.empty.setVisible(not vms)
        self.updateGeometry()  # the minimum width below may have changed

    def _kept_in_place(self, anchor: tuple[int, int], d: int, new: list[int]) -> Optional[tuple[int, int]]:
        """What stays where it is on screen when the path shown becomes `new`, `d` the first
        index where it differs: the message at the top of the viewport (`anchor`: its id, its
        top minus the scroll value), unless a message at or above it was replaced (a variant
        switched, a reply regenerated, an edit): then the one replacing the first of them takes
        its place, where it was. None: the path ends above the viewport (a delete): the end is
        shown."""
        if self.order.index(anchor[0]) < d:
            return anchor
        if d >= len(new):
            return None
        return new[d], self._top_of(d) - self.verticalScrollBar().value()

    def _top_of(self, index: int) -> int:
        """Message `index`'s top in the canvas: its widget's in the window, else where the
        spacer's heights put it."""
        w = self.widgets.get(self.order[index])
        if self.lo <= index < self.hi and w is not None and w.isVisible():
            return self._top(w)
        if index < self.lo:
            return self._top(self.top_pad) + sum(self._height(i) + SPACING for i in range(index))
        return self._top(self.bottom_pad) + sum(self._height(i) + SPACING for i in range(self.hi, index))

    def _window_at(self, index: int, above: Optional[int] = None) -> tuple[int, int]:
        """The window around message `index`: `above` pixels above it (default: MARGIN_PX and
        the viewport's height, as below it), at least WINDOW_MIN messages (everything, when not
        virtualizing). A scroll passes MARGIN_PX: `index` is then the viewport's top message."""
        n = len(self.vms)
        if not VIRTUALIZE or n <= WINDOW_MIN:
            return 0, n
        index = min(max(index, 0), n - 1)
        reach = MARGIN_PX + self.viewport().height()
        lo, hi, up, down = index, index + 1, 0, 0
        while lo > 0 and (up < (reach if above is None else above) or hi - lo < WINDOW_MIN // 2):
            lo -= 1
            up += self._height(lo) + SPACING
        while hi < n and (down < reach or hi - lo < WINDOW_MIN):
            down += self._height(hi) + SPACING
            hi += 1
        while lo > 0 and hi - lo < WINDOW_MIN:
            lo -= 1
        return lo, hi

    def _height(self, i: int) -> int:
        vm = self.vms[i]
        width = self.column.width()
        return self.heights.get((vm.id, vm.content, width)) or estimate_height(vm, width)

    def _place(self, window: tuple[int, int], anchor: Optional[tuple[int, int]] = None) -> None:
        """Put vms[lo:hi] in the layout (building what is missing, dropping what left), size the
        spacers, and keep `anchor` (message id, its top minus the scroll value) where it was."""
        lo, hi = window
        self._moving = True
        try:
            self._measure()
            inside = set(self.order[lo:hi])
            for mid in [m for m in self.widgets if m not in inside]:
                if self._keeps(self.widgets[mid]):
                    self._set_aside(self.widgets[mid])
                else:
                    self._drop(mid)
            items: list[QWidget] = [self._built(vm) for vm in self.vms[lo:hi]]
            marker = self._marker
            if marker is not None and lo <= marker[0] <= hi:
                items.insert(marker[0] - lo, self.marker)
                self.marker.setText(marker[1])
            self.marker.setVisible(marker is not None and lo <= marker[0] <= hi)
            if self.marker.isHidden():
                self.col_layout.removeWidget(self.marker)
            for i, w in enumerate(items):
                if self.col_layout.indexOf(w) != i + 2:  # 0: the empty-state label, 1: the top spacer
                    self.col_layout.removeWidget(w)
                    self.col_layout.insertWidget(i + 2, w)
            self.lo, self.hi = lo, hi
            self.top_pad.setFixedHeight(sum(self._height(i) + SPACING for i in range(lo)))
            self._bottom = sum(self._height(i) + SPACING for i in range(hi, len(self.vms)))
            self._size_bottom()
            self.top_pad.setVisible(lo > 0)
            for mid in self.order[lo:hi]:
                # A widget new to the layout is shown only by a queued call (QLayout::addChildWidget):
                # until the event loop ran it, a new reply and its badge read as hidden (CI once
                # caught the identity badge so). Shown now, the view is whole when this returns.
                self.widgets[mid].show()
            self._paint_selection()
            if anchor is not None and anchor[0] in inside:
                self._hold(anchor)
        finally:
            self._moving = False
        self._pin = anchor if anchor is not None and anchor[0] in inside else self._anchor()

    def _built(self, vm: MessageVM) -> MessageWidget:
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
            w.continueRequested.connect(self.continueRequested)
            w.regenerateRequested.connect(self.regenerateRequested)
            w.documentRemoved.connect(self.documentRemoved)
            self.widgets[vm.id] = w
            if self.mark is not None and self.mark[0] == vm.id:  # rebuilt (the window moved): still marked
                w.set_flash(True)
                w.body.set_marks(self.mark[1])
            pending = self._streaming()
            if pending is not None and pending.reply_id == vm.id:  # built while it streams: as it is now
                gen = self.chat.generation  # type: ignore[union-attr]
                if gen.stream.text or gen.stream.tokens:
                    w.set_stream(gen.stream.text, gen.stream.tokens)
                if gen.replay is not None:
                    w.set_replay(gen.replay)
        return w

    def _keeps(self, w: MessageWidget) -> bool:
        """A widget with state of its own, kept (hidden) while outside the window."""
        return w.streaming or w.editing or w.tokens_button.isChecked() or w.vm.id == self.selected_id

    def _size_bottom(self) -> None:
        """The bottom spacer: the messages below the window, and the slack."""
        self.bottom_pad.setFixedHeight(self._bottom + self._slack)
        self.bottom_pad.setVisible(self.hi < len(self.vms) or self._slack > 0)

    def _hold(self, anchor: tuple[int, int]) -> None:
        """Scroll so that `anchor` (a message in the layout: its id, its top minus the scroll
        value) is where it was; when the path ends too soon under it, with the slack that
        needs (no more: the slack follows what is below)."""
        self._settle()  # positions as laid out now (a range change can come before the layout)
        target = self._top(self.widgets[anchor[0]]) - anchor[1]
        self._set_slack(target + self.viewport().height() - self._natural_end())
        self.verticalScrollBar().setValue(target)

    def _natural_end(self) -> int:
        """Where the canvas would end without the slack: under the last message (or the spacer
        standing for those below the window), and the canvas' margin."""
        if self.hi < len(self.vms) or self._slack:
            end = self._top(self.bottom_pad) + self._bottom
        else:
            last = self.widgets.get(self.order[-1]) if self.order else None
            end = self._top(last) + last.height() if last is not None and last.isVisible() else 0
        return end + self.widget().layout().contentsMargins().bottom()

    def _set_slack(self, px: int) -> None:
        px = max(px, 0)
        if px != self._slack:
            self._slack = px
            self._size_bottom()
            self._settle()

    def _trim_slack(self) -> None:
        """The user scrolled up: only the slack the viewport still shows is kept (it is never
        scrolled into again)."""
        if self._slack:
            shown_end = self.verticalScrollBar().value() + self.viewport().height()
            self._set_slack(min(self._slack, shown_end - self._natural_end()))

    def _set_aside(self, w: MessageWidget) -> None:
        """Out of the layout, hidden, kept. Focus inside it (an open editor) moves to the view
        first: hidden with the focus, Qt would give it to the next widget in the tab chain and
        scroll there, back from where the user scrolled to."""
        if w.isAncestorOf(QApplication.focusWidget()):
            self.setFocus(Qt.FocusReason.OtherFocusReason)
        self.col_layout.removeWidget(w)
        w.hide()

    def _drop(self, mid: int) -> None:
        w = self.widgets.pop(mid)
        self.col_layout.removeWidget(w)
        # Hide and detach now: deleteLater waits for the event loop, and until then the old
        # widget would still paint under its replacement.
        w.hide()
        w.setParent(None)
        w.deleteLater()

    def _measure(self) -> None:
        """Remember the height of every message in the layout, at this width."""
        width = self.column.width()
        for mid in self.order[self.lo:self.hi]:
            w = self.widgets.get(mid)
            if w is not None and w.isVisible() and w.height() > 0:
                self.heights[(mid, w.vm.content, width)] = w.height()

    def _settle(self) -> None:
        """Lay out now (the canvas, then the column inside it), so positions are final, and let
        the scroll area size the canvas to it now (its range: a value set before would be cut
        to the old one)."""
        self.widget().layout().activate()
        self.col_layout.activate()
        self.widget().layout().activate()
        QApplication.sendPostedEvents(self.viewport(), QEvent.Type.LayoutRequest)

    def _top(self, w: QWidget) -> int:
        """`w`'s top in the scrolled canvas."""
        return w.mapTo(self.widget(), w.rect().topLeft()).y()

    def _anchor(self) -> Optional[tuple[int, int]]:
        """The first message of the window in the viewport: its id and its top relative to the
        scroll value (None: the viewport shows only spacer, after a jump)."""
        value = self.verticalScrollBar().value()
        end = value + self.viewport().height()
        for mid in self.order[self.lo:self.hi]:
            w = self.widgets.get(mid)
            if w is not None and w.isVisible() and self._top(w) + w.height() > value:
                return (mid, self._top(w) - value) if self._top(w) < end else None
        return None

    def _move(self) -> None:
        """After a scroll: move the window when the viewport nears its edge."""
        self._move_queued = False
        n = len(self.vms)
        if not VIRTUALIZE or n <= WINDOW_MIN or self._moving:
            return
        anchor = self._anchor()
        value, height = self.verticalScrollBar().value(), self.viewport().height()
        top = self._top(self.top_pad) + self.top_pad.height() if self.lo > 0 else 0
        bottom = self._top(self.bottom_pad) if self.hi < n else self.widget().height()
        # Moved while a quarter of the margin is used up: each move builds a few messages (a
        # few milliseconds), rather than a screenful at once (a visible hitch).
        near_top = self.lo > 0 and value - top < MARGIN_PX * 3 // 4
        near_bottom = self.hi < n and bottom - (value + height) < MARGIN_PX * 3 // 4
        if anchor is None:  # jumped past the window (the scroll bar dragged): by the spacers' sizes
            index, y = 0, 0
            while index < n - 1 and y + self._height(index) + SPACING < value:
                y += self._height(index) + SPACING
                index += 1
            self._place(self._window_at(index))
        elif near_top or near_bottom:
            self._place(self._window_at(self.order.index(anchor[0]), MARGIN_PX), anchor)

    def minimumSizeHint(self) -> QSize:  # type: ignore[override]
        """Never narrower than its messages can be (their button rows): in a narrow window the
        dock and the sidebar give way, instead of messages being cut off at the viewport's edge."""
        s = super().minimumSizeHint()
        margins = self.widget().layout().contentsMargins()
        need = (self.column.minimumSizeHint().width() + margins.left() + margins.right()
                + self.verticalScrollBar().sizeHint().width() + 2 * self.frameWidth())  # fmt: skip
        return QSize(max(s.width(), need), s.height())

    def message_widgets(self) -> list[MessageWidget]:
        """The widgets in the layout now (the window), in order."""
        return [self.widgets[i] for i in self.order[self.lo:self.hi]]

    def widget_for(self, message_id: int) -> Optional[MessageWidget]:
        """`message_id`'s widget, built and scrolled into view if it was outside the window."""
        if message_id not in self.order:
            return None
        index = self.order.index(message_id)
        if not self.lo <= index < self.hi:
            self._stick = False
            self._place(self._window_at(index))
            self._settle()
            self._moving = True
            try:
                self.ensureWidgetVisible(self.widgets[message_id], 0, 40)
            finally:
                self._moving = False
            self._pin = self._anchor()  # what is at the top now stays there as heights settle
        return self.widgets.get(message_id)

    def select(self, message_id: int) -> None:
        """A click on a message: ask for it (the conversation decides; its selection is marked).
        The next action after a search: its mark goes."""
        self.clear_mark()
        self.selected.emit(message_id)

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
        """The reply's text so far (a message not built is shown as it is then, when it is)."""
        w = self.widgets.get(message_id)
        if w is not None:
            w.set_stream(text, count)

    def replay(self, message_id: int, replay: Replay) -> None:
        """A regenerate expected to repeat its reply: the reply's text at once, verified as it streams."""
        w = self.widgets.get(message_id)
        if w is not None:
            w.set_replay(replay)

    def prefill(self, message_id: int, done: int, total: int) -> Optional[str]:
        """Show prefill progress on the reply; the line shown (None: the reply is not in view)."""
        w = self.widgets.get(message_id)
        return w.set_prefill(done, total) if w is not None else None

    def end_stream(self, message_id: int) -> None:
        w = self.widgets.get(message_id)
        if w is not None:
            w.end_stream()

    # -- scrolling -------------------------------------------------------------------------------
    def keyPressEvent(self, event: QKeyEvent) -> None:  # type: ignore[override]
        """PageUp / PageDown a page, Home / Ctrl+Home to the first message, End / Ctrl+End to
        the last, from wherever the focus is in the conversation (a message's text and buttons
        pass these keys up: scroll_keys.scrolls_the_conversation)."""
        if not scrolls_the_conversation(event):
            super().keyPressEvent(event)
            return
        bar = self.verticalScrollBar()
        key = event.key()
        if key == Qt.Key.Key_End:
            self.scroll_to_bottom()
        elif key == Qt.Key.Key_Home:
            self._stick = False
            bar.setValue(0)
        else:
            bar.triggerAction(bar.SliderAction.SliderPageStepAdd if key == Qt.Key.Key_PageDown
                              else bar.SliderAction.SliderPageStepSub)  # fmt: skip
        event.accept()

    SETTLE_MS = 1500  # how long a revealed hit is kept in view while the messages above lay out

    def reveal(self, message_id: int, terms: Optional[list[str]] = None) -> None:
        """Scroll `message_id` into view and mark it (a search hit), its `terms` marked in its
        text; the mark stays until the next action (clear_mark)."""
        w = self.widget_for(message_id)
        if w is None:
            return
        self.clear_mark()
        self.mark = (message_id, list(terms or []))
        self._stick = False  # a jump up the conversation: do not follow the bottom
        w.set_flash(True)
        w.body.set_marks(self.mark[1])
        self._revealing = message_id  # the messages above may still grow as they lay out: follow it
        self._settle()  # geometry up to date before scrolling to it
        self._show_hit(w)
        QTimer.singleShot(self.SETTLE_MS, lambda: self._end_reveal(message_id))

    def _show_hit(self, w: MessageWidget) -> None:
        """Bring a search hit into view: the line of its first match (a message taller than
        the window is not centred, which would leave that line above the top), else the
        message itself."""
        line = w.body.hit_line()
        if line is None:
            self.ensureWidgetVisible(w, 0, 40)
            return
        top = w.body.viewport().mapTo(self.widget(), line.topLeft())
        margin = max(line.height(), self.viewport().height() // 4)  # the line well inside, not on the edge
        self.ensureVisible(top.x(), top.y() + line.height() // 2, 0, margin)

    @property
    def following(self) -> Optional[int]:
        """The search hit kept in view while the layout settles (None: none now)."""
        return self._revealing

    def _end_reveal(self, message_id: int) -> None:
        if self._revealing == message_id:
            self._revealing = None

    def clear_mark(self) -> None:
        """The next action after a search (a click, typing, a send, another conversation): the
        hit's mark and its words' marks go."""
        if self.mark is None:
            return
        w = self.widgets.get(self.mark[0])
        self.mark = None
        if w is not None and shiboken6.isValid(w):
            w.set_flash(False)
            w.body.set_marks([])

    def scroll_to_bottom(self) -> None:
        self.clear_mark()  # a send, another conversation: the next action
        self._stick = True
        self._revealing = None
        self._set_slack(0)
        if self.hi < len(self.vms):
            self._place(self._window_at(len(self.vms) - 1))
        QTimer.singleShot(0, lambda: self._stick and self.verticalScrollBar().setValue(self.verticalScrollBar().maximum()))

    def _on_range(self, _min: int, maximum: int) -> None:
        """The canvas changed height (messages laid out, a spacer resized): keep in view what
        was: a search hit, the bottom, or the message at the top of the viewport."""
        if self._moving:
            return  # the window is being moved: it sets the scroll value itself
        pin = self._pin
        if self._revealing is not None and self._revealing in self.widgets:
            self._show_hit(self.widgets[self._revealing])
        elif self._stick:
            self.verticalScrollBar().setValue(maximum)
        elif pin is not None and pin[0] in self.widgets and self.widgets[pin[0]].isVisible():
            self._moving = True
            try:
                self._hold(pin)
            finally:
                self._moving = False

    def _on_scroll(self, value: int) -> None:
        # Following the bottom: at the end of the conversation (not of a slack held for a message).
        self._stick = not self._slack and value >= self.verticalScrollBar().maximum() - 24
        if not self._moving:
            self._pin = self._anchor()
            self._trim_slack()
        if not self._moving and not self._move_queued and VIRTUALIZE and len(self.vms) > WINDOW_MIN:
            self._move_queued = True
            QTimer.singleShot(0, self._move)
