"""The conversation: one widget per message of the active path, streaming into the last one.

`set_messages` diffs by message id and re-renders only what changed, so finishing a reply or
switching a variant does not re-render a long conversation. Streaming text arrives already
batched by the chat model (app/core/chat.py); each batch re-renders only the streaming message.
One message's widget is app/qt/widgets/message_widget.py.
"""

from __future__ import annotations

from typing import Optional

from PySide6.QtCore import QSize, Qt, QTimer, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QScrollArea, QVBoxLayout, QWidget

from app.core.markdown import Palette
from app.core.view_models import MessageVM
from app.qt.widgets.message_widget import MessageBody, MessageWidget

__all__ = ["ChatView", "MessageBody", "MessageWidget"]


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
        self._revealing: Optional[int] = None  # a search hit kept in view while the layout settles
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
        for mid in self.order:
            # A widget new to the layout is shown only by a queued call (QLayout::addChildWidget):
            # until the event loop ran it, a new reply and its badge read as hidden (CI once
            # caught the identity badge so). Shown now, the view is whole when this returns.
            self.widgets[mid].show()
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

    def prefill(self, message_id: int, done: int, total: int) -> Optional[str]:
        """Show prefill progress on the reply; the line shown (None: the reply is not in view)."""
        w = self.widgets.get(message_id)
        return w.set_prefill(done, total) if w is not None else None

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
        self._revealing = message_id  # the messages above may still grow as they lay out: follow it
        self.widget().layout().activate()  # geometry up to date before scrolling to it
        self.ensureWidgetVisible(w, 0, 40)
        w.set_flash(True)
        QTimer.singleShot(self.FLASH_MS, lambda: self._end_reveal(message_id))

    def _end_reveal(self, message_id: int) -> None:
        if message_id in self.widgets:
            self.widgets[message_id].set_flash(False)
        if self._revealing == message_id:
            self._revealing = None

    def scroll_to_bottom(self) -> None:
        self._stick = True
        self._revealing = None
        QTimer.singleShot(0, lambda: self._stick and self.verticalScrollBar().setValue(self.verticalScrollBar().maximum()))

    def _on_range(self, _min: int, maximum: int) -> None:
        if self._revealing is not None and self._revealing in self.widgets:
            self.ensureWidgetVisible(self.widgets[self._revealing], 0, 40)
        elif self._stick:
            self.verticalScrollBar().setValue(maximum)

    def _on_scroll(self, value: int) -> None:
        self._stick = value >= self.verticalScrollBar().maximum() - 24
