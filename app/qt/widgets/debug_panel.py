"""The debug panel: everything the prompt cache did for the selected reply, and the store totals.

Renders a stored `CacheReport` dict (the same object the CLI prints with --json), so what the
panel shows for a reply is what was saved with it, also after a restart.
"""

from __future__ import annotations

import json
from typing import Any, Optional

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

from app.core.view_models import MessageVM, format_bytes, format_seconds

REPORT_FIELDS = [
    ("prompt_tokens", "Prompt tokens"),
    ("matched", "Matched prefix"),
    ("restored_stored", "Restored / stored"),
    ("partial", "Partial restore"),
    ("source", "Source"),
    ("mode", "Mode"),
    ("chunk_size", "Chunk size"),
    ("prefill_tokens", "Prefill tokens"),
    ("chunks", "Prefill chunks"),
    ("snapshots", "Snapshots stored"),
    ("seed", "Seed"),
    ("sampler", "Sampler"),
    ("model_key", "Model key"),
]
TIMING_FIELDS = [("ttft", "Time to first token"), ("prefill_tps", "Prefill"), ("decode_tps", "Decode")]
STORE_FIELDS = [("entries", "Snapshots in memory"), ("memory", "Memory"), ("disk", "On disk"), ("hits", "Hits / lookups")]


def _form(box: QGroupBox, fields: list[tuple[str, str]], out: dict[str, QLabel]) -> QFormLayout:
    form = QFormLayout(box)
    form.setLabelAlignment(Qt.AlignmentFlag.AlignLeft)
    form.setHorizontalSpacing(14)
    form.setVerticalSpacing(3)
    for key, label in fields:
        value = QLabel("–")
        value.setObjectName(f"debug_{key}")
        value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        value.setWordWrap(True)
        out[key] = value
        name = QLabel(label)
        name.setObjectName("debugKey")
        form.addRow(name, value)
    return form


def chunks_text(chunks: list[list[int]]) -> str:
    if not chunks:
        return "none (whole prompt restored)"
    shown = [f"[{a}, {b})" for a, b in chunks]
    if len(shown) > 8:
        shown = shown[:4] + ["…"] + shown[-3:]
    return f"{len(chunks)} forward{'s' if len(chunks) != 1 else ''}: " + " ".join(shown)


def sampler_text(s: dict[str, Any]) -> str:
    if not s:
        return "–"
    keys = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens")
    short = {"temperature": "T", "repetition_penalty": "rep", "max_tokens": "max"}
    return ", ".join(f"{short.get(k, k)}={s[k]}" for k in keys if k in s)


class DebugPanel(QDockWidget):
    verifyRequested = Signal(int)  # reply id
    clearRequested = Signal()

    def __init__(self, parent: Optional[QWidget] = None) -> None:
        super().__init__("Debug", parent)
        self.setObjectName("debugPanel")
        self.setAllowedAreas(Qt.DockWidgetArea.LeftDockWidgetArea | Qt.DockWidgetArea.RightDockWidgetArea)
        self.reply_id: Optional[int] = None
        self.values: dict[str, QLabel] = {}
        self.report: dict[str, Any] = {}
        self._pending_vm: Optional[MessageVM] = None
        self._dirty = False

        inner = QWidget()
        inner.setObjectName("debugInner")
        lay = QVBoxLayout(inner)
        lay.setContentsMargins(10, 8, 10, 10)
        lay.setSpacing(8)
        self.title = QLabel("No reply selected")
        self.title.setObjectName("debugTitle")
        self.title.setWordWrap(True)
        lay.addWidget(self.title)

        cache_box = QGroupBox("Prompt cache")
        _form(cache_box, REPORT_FIELDS, self.values)
        lay.addWidget(cache_box)

        decl_box = QGroupBox("Declined snapshots")
        self.declines = QLabel("none")
        self.declines.setObjectName("debug_declines")
        self.declines.setWordWrap(True)
        self.declines.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        QVBoxLayout(decl_box).addWidget(self.declines)
        lay.addWidget(decl_box)

        ident_box = QGroupBox("Identity")
        ident = _form(ident_box, [("identity", "Previous variant"), ("verify", "Cold run")], self.values)
        self.verify_button = QPushButton("Verify against a cold run")
        self.verify_button.setObjectName("verifyButton")
        self.verify_button.setToolTip("Generate this reply again with no cache at all and compare token by token")
        self.verify_button.clicked.connect(lambda: self.reply_id is not None and self.verifyRequested.emit(self.reply_id))
        ident.addRow(self.verify_button)
        lay.addWidget(ident_box)

        time_box = QGroupBox("Timings")
        _form(time_box, TIMING_FIELDS, self.values)
        lay.addWidget(time_box)

        store_box = QGroupBox("Cache store")
        store = _form(store_box, STORE_FIELDS, self.values)
        self.clear_button = QPushButton("Clear cache")
        self.clear_button.setObjectName("clearCacheButton")
        self.clear_button.clicked.connect(self.clearRequested)
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(self.clear_button)
        store.addRow(row)
        lay.addWidget(store_box)

        self.layers = QTableWidget(0, 5)
        self.layers.setObjectName("layerTable")
        self.layers.setHorizontalHeaderLabels(["#", "Cache class", "Offset", "Size", "Trim"])
        self.layers.verticalHeader().setVisible(False)
        self.layers.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.layers.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.layers.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.layers.horizontalHeader().setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        self.layers.setMinimumHeight(120)
        self.layers.setMaximumHeight(320)
        self.layers.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.layers.verticalHeader().setDefaultSectionSize(22)
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

    def value(self, key: str) -> str:
        return self.values[key].text()

    # -- the selected reply ----------------------------------------------------------------------
    def show_reply(self, vm: Optional[MessageVM]) -> None:
        """Show `vm`'s report; while the panel is hidden only remember it (filled when shown)."""
        self._pending_vm = vm
        if not self.isVisible():
            self._dirty = True
            return
        self._dirty = False
        self._fill(vm)

    def showEvent(self, event: Any) -> None:  # type: ignore[override]
        super().showEvent(event)
        if self._dirty:
            self._dirty = False
            self._fill(self._pending_vm)

    def _fill(self, vm: Optional[MessageVM]) -> None:
        same = vm is not None and vm.id == self.reply_id
        self.reply_id = vm.id if vm is not None else None
        r = dict(vm.report) if vm is not None else {}
        self.report = r
        self.verify_button.setEnabled(vm is not None and bool(r) and vm.status != "generating")
        if not same:
            self.values["verify"].setText("–")
        if vm is None or not r:
            self.title.setText("No reply selected" if vm is None else "This reply has no cache report yet")
            for key, _ in REPORT_FIELDS + TIMING_FIELDS + [("identity", "")]:
                self.values[key].setText("–")
            self.layers.setRowCount(0)
            self.declines.setText("none")
            return
        action = {"regenerate": "regenerated", "variant": "new variant", "edit": "after an edit", "retry": "retry"}
        how = action.get(r.get("action") or "", "")
        self.title.setText(
            f"<b>Reply {vm.navigator}</b>" + (f" · {how}" if how else "") + f" · message #{vm.id}"
        )
        stored = r.get("stored")
        v = self.values
        v["prompt_tokens"].setText(str(r.get("prompt_tokens", "–")))
        v["matched"].setText(str(r.get("matched", "–")))
        v["restored_stored"].setText(f"{r.get('restored', 0)} / {stored if stored is not None else '–'}")
        v["partial"].setText("yes (cut back)" if r.get("partial") else "no")
        v["source"].setText(r.get("source") or "none (cold prefill)")
        v["mode"].setText(str(r.get("mode", "–")))
        v["chunk_size"].setText(str(r.get("chunk_size", "–")))
        v["prefill_tokens"].setText(str(r.get("prefill_tokens", "–")))
        v["chunks"].setText(chunks_text(r.get("chunks") or []))
        snaps = r.get("snapshots_stored") or []
        v["snapshots"].setText(
            ", ".join(f"{s.get('kind')} @{s.get('length')} (canonical {s.get('canonical')})" for s in snaps) or "none"
        )
        v["seed"].setText(str(r.get("seed", "–")))
        v["sampler"].setText(sampler_text(r.get("sampler") or {}))
        key = str(r.get("model_key") or "")
        v["model_key"].setText(key[:16] + ("…" if len(key) > 16 else ""))
        v["model_key"].setToolTip(key)
        v["ttft"].setText(format_seconds(r.get("ttft_s")))
        v["prefill_tps"].setText(f"{r.get('prefill_tps') or 0:.1f} tok/s")
        v["decode_tps"].setText(f"{r.get('decode_tps') or 0:.1f} tok/s")
        v["identity"].setText(self._identity(vm, r))
        self._fill_layers(r.get("layers") or [])
        declines = r.get("declines") or []
        self.declines.setText("\n".join(f"• {d}" for d in declines) if declines else "none")

    @staticmethod
    def _identity(vm: MessageVM, r: dict[str, Any]) -> str:
        if r.get("identical") is None:
            return "no previous variant with the same prompt and settings"
        if r.get("identical"):
            return "identical to previous (same tokens, bit-equal logprobs)"
        if r.get("first_diff") is None:
            return f"same tokens, logprobs differ by up to {r.get('max_logprob_diff', 0):.3g}"
        return f"differs from previous at token {r.get('first_diff')}"

    def _fill_layers(self, layers: list[dict[str, Any]]) -> None:
        self.layers.setRowCount(len(layers))
        for row, layer in enumerate(layers):
            offset = layer.get("offset")
            cells = [
                str(layer.get("index", row)),
                str(layer.get("cache_class", "")),
                "–" if offset is None else str(offset),
                str(layer.get("size", "")),
                "yes" if layer.get("trimmable") else "no",
            ]
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if col != 1:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.layers.setItem(row, col, item)

    # -- verify and the store --------------------------------------------------------------------
    def set_verifying(self, on: bool) -> None:
        self.verify_button.setEnabled(not on and self.reply_id is not None)
        if on:
            self.values["verify"].setText("running a cold generation…")

    def show_verify(self, reply_id: int, text: str) -> None:
        if reply_id == self.reply_id:
            self.values["verify"].setText(text)

    def show_stats(self, stats: dict[str, Any]) -> None:
        v = self.values
        v["entries"].setText(str(stats.get("memory_entries", "–")))
        budget = stats.get("memory_budget_bytes")
        v["memory"].setText(
            format_bytes(stats.get("memory_bytes")) + (f" of {format_bytes(budget)}" if budget else "")
        )
        disk = {k[5:]: val for k, val in stats.items() if k.startswith("disk_")}
        if not disk:
            v["disk"].setText("no disk tier")
        else:
            entries = disk.get("entries", disk.get("count"))
            nbytes = disk.get("bytes", disk.get("size_bytes"))
            parts = []
            if entries is not None:
                parts.append(f"{entries} snapshot{'s' if entries != 1 else ''}")
            if nbytes is not None:
                parts.append(format_bytes(nbytes))
            v["disk"].setText(", ".join(parts) or json.dumps(disk))
            v["disk"].setToolTip(json.dumps(disk, indent=1, default=str))
        v["hits"].setText(f"{stats.get('hits', 0)} / {stats.get('lookups', 0)}")
