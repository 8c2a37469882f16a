"""The debug panel: everything the prompt cache did for the selected reply, and the store totals.

Shows a reply's run: its `CacheReport` and `ReplyOutcome` (the latest run, or one picked from the
reply's runs; stored, so also after a restart), as worded by `view_models.debug_vm`; while the
selected reply is being made, its run in progress (the generation's `LiveRun`: what was restored
and from where, the declines, the forwards made of those planned, `live_run.live_debug_vm`) until
the final report replaces it; this module only lays them out. Bound to the selected reply (the open conversation's selection), the cold
runs (Verify's verdict) and the engine link (the cache store's numbers; a server's cache is its
own, so no Clear cache then); Verify and Clear cache are intents to those.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDockWidget,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QScrollArea,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.core.engine_link.memory_text import memory_split_text
from app.core.generation.live_run import LiveRun, live_debug_vm, live_title
from app.core.store import Run

if TYPE_CHECKING:
    from app.core.chat import Chat
    from app.core.engine_link.model import ServerLink
    from engine.memory import MemoryReport
from app.qt.widgets.wrap_label import WrapLabel
from app.core.conversation.view_models import (
    IDENTITY_FIELDS,
    LAYER_COLUMNS,
    NO_REPLY,
    NO_REPORT,
    REPORT_FIELDS,
    STORE_FIELDS,
    TIMING_FIELDS,
    VERIFYING,
    DebugVM,
    MessageVM,
    debug_vm,
    stats_rows,
)


def _form(box: QGroupBox, fields: list[tuple[str, str]], out: dict[str, QLabel],
          keys: Optional[dict[str, QLabel]] = None) -> QFormLayout:  # fmt: skip
    form = QFormLayout(box)
    # A narrowed dock: a value that does not fit beside its label goes below it (not off the edge).
    form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
    form.setLabelAlignment(Qt.AlignmentFlag.AlignLeft)
    form.setHorizontalSpacing(14)
    form.setVerticalSpacing(3)
    for key, label in fields:
        # As tall as its wrapped text at the width it gets (WrapLabel): a QLabel's height came
        # from another width's hint and lost its last line ("…, max=48") with room below.
        value = WrapLabel("–")
        value.setObjectName(f"debug_{key}")
        value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        out[key] = value
        name = QLabel(label)
        name.setObjectName("debugKey")
        if keys is not None:
            keys[key] = name
        form.addRow(name, value)
    return form


def _table(columns: list[str], name: str) -> QTableWidget:
    """A read-only table with a header row (no row numbers, no selection)."""
    table = QTableWidget(0, len(columns))
    table.setObjectName(name)
    table.setHorizontalHeaderLabels(columns)
    table.verticalHeader().setVisible(False)
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
    table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    table.verticalHeader().setDefaultSectionSize(22)
    return table


REMOTE_STORE_LABELS = {"entries": "Snapshots", "memory": "Server"}  # the rows stats_rows fills for a server


class DebugPanel(QDockWidget):
    verifyRequested = Signal(int)  # reply id
    clearRequested = Signal()
    compareRequested = Signal(int)  # reply id: open the compare view

    def __init__(self, chat: Optional["Chat"] = None, parent: Optional[QWidget] = None) -> None:
        super().__init__("Debug", parent)
        self.setObjectName("debugPanel")
        self.setAllowedAreas(Qt.DockWidgetArea.LeftDockWidgetArea | Qt.DockWidgetArea.RightDockWidgetArea)
        self.reply_id: Optional[int] = None
        self.values: dict[str, QLabel] = {}
        self._pending_vm: Optional[MessageVM] = None
        self._pending_run: Optional[Run] = None
        self._live: Optional[LiveRun] = None  # the reply being made's run, as far as it got
        self._dirty = False

        inner = QWidget()
        inner.setObjectName("debugInner")
        lay = QVBoxLayout(inner)
        lay.setContentsMargins(10, 8, 10, 10)
        lay.setSpacing(8)
        self.title = QLabel(NO_REPLY)
        self.title.setObjectName("debugTitle")
        self.title.setWordWrap(True)
        lay.addWidget(self.title)

        cache_box = QGroupBox("Prompt cache")
        _form(cache_box, REPORT_FIELDS, self.values)
        lay.addWidget(cache_box)

        # A run on several ranks (a Verbatim server under mlx.launch): what each rank's cache did.
        self.ranks = QLabel()
        self.ranks.setObjectName("debug_ranks")
        self.ranks.setWordWrap(True)
        self.ranks.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.rank_box = QGroupBox("Ranks")
        QVBoxLayout(self.rank_box).addWidget(self.ranks)
        self.rank_box.setVisible(False)
        lay.addWidget(self.rank_box)

        # The documents in the prompt: each one's tokens and where its state came from.
        self.documents = WrapLabel("")
        self.documents.setObjectName("debug_documents")
        self.documents.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.document_box = QGroupBox("Documents")
        QVBoxLayout(self.document_box).addWidget(self.documents)
        self.document_box.setVisible(False)
        lay.addWidget(self.document_box)

        decl_box = QGroupBox("Declined snapshots")
        self.declines = QLabel("none")
        self.declines.setObjectName("debug_declines")
        self.declines.setWordWrap(True)
        self.declines.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        QVBoxLayout(decl_box).addWidget(self.declines)
        lay.addWidget(decl_box)

        ident_box = QGroupBox("Identity")
        ident = _form(ident_box, IDENTITY_FIELDS, self.values)
        self.verify_button = QPushButton("Verify against a cold run")
        self.verify_button.setObjectName("verifyButton")
        self.verify_button.setToolTip("Generate this reply again with no cache at all and compare token by token")
        self.verify_button.clicked.connect(lambda: self.reply_id is not None and self.verifyRequested.emit(self.reply_id))
        ident.addRow(self.verify_button)
        self.compare_button = QPushButton("Compare token by token…")
        self.compare_button.setObjectName("debugCompareButton")
        self.compare_button.setToolTip("Where this reply and another variant (or a cold run) part, and by how much")
        self.compare_button.clicked.connect(lambda: self.reply_id is not None and self.compareRequested.emit(self.reply_id))
        ident.addRow(self.compare_button)
        lay.addWidget(ident_box)

        time_box = QGroupBox("Timings")
        _form(time_box, TIMING_FIELDS, self.values)
        lay.addWidget(time_box)

        self.store_box = store_box = QGroupBox("Cache store")
        self.store_keys: dict[str, QLabel] = {}
        store = _form(store_box, STORE_FIELDS, self.values, self.store_keys)
        self.clear_button = QPushButton("Clear cache")
        self.clear_button.setObjectName("clearCacheButton")
        self.clear_button.clicked.connect(self.clearRequested)
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(self.clear_button)
        store.addRow(row)
        lay.addWidget(store_box)

        # The process's memory: the weights, the live KV cache, the memory tier, MLX's buffer cache,
        # RSS (Engine.memory_report, read again after every run); a server's is its own.
        self.memory_box = QGroupBox("Memory (this process)")
        self.process_memory = WrapLabel("–")
        self.process_memory.setObjectName("debug_process_memory")
        self.process_memory.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        QVBoxLayout(self.memory_box).addWidget(self.process_memory)
        lay.addWidget(self.memory_box)

        self.layers = _table(LAYER_COLUMNS, "layerTable")
        self.layers.horizontalHeader().setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        self.layers.setMinimumHeight(120)
        self.layers.setMaximumHeight(320)
        self.layers.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        layer_box = QGroupBox("Layers after restore")
        QVBoxLayout(layer_box).addWidget(self.layers)
        lay.addWidget(layer_box)

        lay.addStretch(1)

        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        scroll.setWidget(inner)
        self.setWidget(scroll)
        self._fill(None)
        if chat is not None:
            self._bind(chat)

    def _bind(self, chat: "Chat") -> None:
        chat.conversation.selected_changed.connect(self.show_reply)
        chat.link.stats_changed.connect(lambda stats, memory: self.show_stats(stats))
        chat.link.server_changed.connect(self._show_server)
        chat.link.memory_changed.connect(lambda report: self.show_memory(report, chat.link.server is not None))
        chat.cold_runs.verify_changed.connect(self._show_verify)
        chat.generation.live_changed.connect(self.show_live)
        self.verifyRequested.connect(chat.cold_runs.verify)
        self.clearRequested.connect(chat.link.clear_cache)

    def _show_server(self, server: Optional["ServerLink"]) -> None:
        self.clear_button.setEnabled(server is None)  # a server's cache is its own
        if server is not None and server.up:
            self.forget_failure()  # "Cold run: failed: cannot reach the server" is stale now

    def _show_verify(self, reply_id: int, text: Optional[str]) -> None:
        self.set_verifying(text is None)  # None: the cold run is under way
        if text is not None:
            self.show_verify(reply_id, text)

    def value(self, key: str) -> str:
        return self.values[key].text()

    # -- the selected reply ----------------------------------------------------------------------
    def show_reply(self, vm: Optional[MessageVM], run: Optional[Run] = None) -> None:
        """Show `vm`'s report (its latest run, or `run`); while the panel is hidden only remember
        it (filled when shown)."""
        self._pending_vm, self._pending_run = vm, run
        if not self.isVisible():
            self._dirty = True
            return
        self._dirty = False
        self._fill(vm, run)

    def show_live(self, live: Optional[LiveRun]) -> None:
        """The run in progress advanced: shown when it is the selected reply's; None: it ended (the
        final report comes with the reply saved, when the selection is read again)."""
        run = live if live is not None else self._live  # the run that advanced or ended
        self._live = live
        if run is None or self._pending_vm is None or self._pending_vm.id != run.reply_id:
            return
        if not self.isVisible():
            self._dirty = True
            return
        self._fill(self._pending_vm, self._pending_run)

    def showEvent(self, event: Any) -> None:  # type: ignore[override]
        super().showEvent(event)
        if self._dirty:
            self._dirty = False
            self._fill(self._pending_vm, self._pending_run)

    def _fill(self, vm: Optional[MessageVM], run: Optional[Run] = None) -> None:
        same = vm is not None and vm.id == self.reply_id
        self.reply_id = vm.id if vm is not None else None
        has_report = vm is not None and vm.report is not None
        self.verify_button.setEnabled(vm is not None and has_report and vm.status != "generating")
        self.compare_button.setEnabled(vm is not None and vm.tokens > 0 and vm.status != "generating")
        if not same:
            self.values["verify"].setText("–")
        live = self._live if vm is not None and self._live is not None and self._live.reply_id == vm.id else None
        if live is not None and run is None:
            self._fill_live(vm, live)
            return
        if vm is None or vm.report is None:
            self._clear(NO_REPLY if vm is None else NO_REPORT)
            return
        self._show_vm(debug_vm(vm, run))

    def _fill_live(self, vm: MessageVM, live: LiveRun) -> None:
        d = live_debug_vm(vm, live)
        if d is None:  # before the restore: only what the run is doing
            self._clear(live_title(vm, live))
            return
        self._show_vm(d)

    def _clear(self, title: str) -> None:
        self.title.setText(title)
        for key, _ in REPORT_FIELDS + TIMING_FIELDS + [("identity", "")]:
            self.values[key].setText("–")
        self.layers.setRowCount(0)
        self.ranks.setText("")
        self.rank_box.setVisible(False)
        self.document_box.setVisible(False)
        self.declines.setText("none")

    def _show_vm(self, d: DebugVM) -> None:
        self.title.setText(d.title)
        for key, text in d.rows.items():
            self.values[key].setText(text)
        self.values["model_key"].setToolTip(d.model_key)
        self.layers.setRowCount(len(d.layers))
        for row, cells in enumerate(d.layers):
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if col != 1:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.layers.setItem(row, col, item)
        self.declines.setText(d.declines)
        self.ranks.setText("\n".join(d.ranks))
        self.rank_box.setTitle(f"Ranks ({len(d.ranks)})")
        self.rank_box.setVisible(bool(d.ranks))
        self.documents.setText("\n".join(d.documents))
        self.document_box.setTitle(f"Documents ({len(d.documents)})")
        self.document_box.setVisible(bool(d.documents))

    # -- verify and the store --------------------------------------------------------------------
    def set_verifying(self, on: bool) -> None:
        self.verify_button.setEnabled(not on and self.reply_id is not None)
        if on:
            self.values["verify"].setText(VERIFYING)

    def show_verify(self, reply_id: int, text: str) -> None:
        if reply_id == self.reply_id:
            self.values["verify"].setText(text)

    def forget_failure(self) -> None:
        """The server answers again: a cold run that failed while it was away is no news now."""
        if self.values["verify"].text().startswith("failed: "):
            self.values["verify"].setText("–")

    def show_memory(self, report: Optional["MemoryReport"], remote: bool = False) -> None:
        """The process's memory split (None and `remote`: the memory is the server's)."""
        self.memory_box.setTitle("Memory (on the server)" if remote else "Memory (this process)")
        self.process_memory.setText(memory_split_text(report, remote))

    def show_stats(self, stats: dict[str, Any]) -> None:
        """The cache store's numbers; attached to a server, each row names what it holds there
        (no "Memory" row holding an address) and there is no Clear cache: the server's is its own."""
        remote = "remote" in stats
        for key, label in STORE_FIELDS:
            self.store_keys[key].setText(REMOTE_STORE_LABELS.get(key, label) if remote else label)
        self.store_box.setTitle("Cache store (on the server)" if remote else "Cache store")
        self.clear_button.setVisible(not remote)
        for key, (text, tip) in stats_rows(stats).items():
            self.values[key].setText(text)
            if tip:
                self.values[key].setToolTip(tip)
