"""The compare view: two replies of one prompt token by token, where they part and by how much.

Renders `app.core.conversation.compare.CompareData` (the alignment and the engine's Comparison) with the
words of view_models (compare_verdict, prefix_text, side_text): a verdict line, each side's
settings and cache source, a plot of both sides' per-token logprobs over |delta logprob|, and an
aligned token table (a virtual model: 4k rows cost nothing until shown) with the first divergent
token highlighted and scrolled to. The inspector (app/qt/inspector/inspector.py) fetches the data.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QSplitter,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from app.core.conversation.compare import CompareData
from app.core.conversation.view_models import compare_verdict, prefix_text, side_text

COLOR_A = QColor(31, 111, 235)
COLOR_B = QColor(207, 120, 20)
COLOR_DIVERGE = QColor(207, 34, 46)
DELTA_FLOOR = 1e-9  # |delta| plotted on a log scale from here to DELTA_TOP
DELTA_TOP = 10.0


def columns(series: Sequence[float], width: int) -> list[tuple[float, float]]:
    """`series` reduced to at most `width` columns of (min, max): what one pixel column shows, so
    painting costs O(width) whatever the number of tokens."""
    n = len(series)
    if n == 0 or width <= 0:
        return []
    if n <= width:
        return [(v, v) for v in series]
    out = []
    for c in range(width):
        chunk = series[c * n // width : max((c + 1) * n // width, c * n // width + 1)]
        out.append((min(chunk), max(chunk)))
    return out


class LogprobPlot(QWidget):
    """Per-token logprob of both sides (top) and |delta logprob| on a log scale (bottom)."""

    def __init__(self, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.setObjectName("logprobPlot")
        self.setMinimumHeight(170)
        self.a: list[float] = []
        self.b: list[float] = []
        self.deltas: list[float] = []
        self.first_diff: Optional[int] = None
        self.lo, self.hi = -1.0, 0.0

    def set_data(self, data: Optional[CompareData]) -> None:
        if data is None:  # cleared
            self.a, self.b, self.deltas, self.first_diff = [], [], [], None
            self.update()
            return
        self.a = [x if math.isfinite(x) else -100.0 for x in data.a.logprobs]
        self.b = [x if math.isfinite(x) else -100.0 for x in data.b.logprobs]
        self.deltas = data.deltas()
        self.first_diff = data.comparison.first_diff
        self.lo, self.hi = data.logprob_range()
        self.update()

    def paintEvent(self, event: Any) -> None:  # type: ignore[override]
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing, False)
        text = self.palette().text().color()
        muted = QColor(text)
        muted.setAlpha(90)
        r = QRectF(self.rect()).adjusted(58, 8, -8, -18)
        top = QRectF(r.left(), r.top(), r.width(), r.height() * 0.66)
        bottom = QRectF(r.left(), top.bottom() + 8, r.width(), r.bottom() - top.bottom() - 8)
        p.setPen(QPen(muted))
        p.drawRect(top)
        p.drawRect(bottom)
        p.setPen(QPen(text))
        p.drawText(QRectF(0, top.top() - 4, 54, 16), Qt.AlignmentFlag.AlignRight, f"{self.hi:.2g}")
        p.drawText(QRectF(0, top.bottom() - 12, 54, 16), Qt.AlignmentFlag.AlignRight, f"{self.lo:.2g}")
        p.drawText(QRectF(0, bottom.top() - 2, 54, 14), Qt.AlignmentFlag.AlignRight, "|Δ|")
        n = max(len(self.a), len(self.b), 1)
        width = max(int(top.width()), 1)
        span = (self.hi - self.lo) or 1.0

        def x_of(i: float) -> float:
            return top.left() + (i + 0.5) * top.width() / n

        def y_of(v: float) -> float:
            return top.bottom() - (min(max(v, self.lo), self.hi) - self.lo) / span * top.height()

        for series, color in ((self.a, COLOR_A), (self.b, COLOR_B)):
            cols = columns(series, width)
            if not cols:
                continue
            p.setPen(QPen(color, 1.2))
            path = QPainterPath()
            scale = len(series) / len(cols)
            for c, (lo, hi) in enumerate(cols):
                x = x_of(c * scale + (scale - 1) / 2)
                if c == 0:
                    path.moveTo(QPointF(x, y_of(hi)))
                else:
                    path.lineTo(QPointF(x, y_of(hi)))
                if lo != hi:
                    path.lineTo(QPointF(x, y_of(lo)))
            p.drawPath(path)
        # |delta| on a log scale: one bar per column (its largest delta)
        cols = columns(self.deltas, width)
        scale = len(self.deltas) / len(cols) if cols else 1.0
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(QBrush(COLOR_DIVERGE))
        decades = math.log10(DELTA_TOP / DELTA_FLOOR)
        bar = max(top.width() / n, 1.0)
        for c, (_, hi) in enumerate(cols):
            if hi <= 0:
                continue
            h = (math.log10(min(max(hi, DELTA_FLOOR), DELTA_TOP) / DELTA_FLOOR)) / decades * bottom.height()
            x = x_of(c * scale) - bar / 2
            p.drawRect(QRectF(x, bottom.bottom() - h, bar, max(h, 1.0)))
        if self.first_diff is not None:
            p.setPen(QPen(COLOR_DIVERGE, 1.5, Qt.PenStyle.DashLine))
            x = x_of(self.first_diff)
            p.drawLine(QPointF(x, top.top()), QPointF(x, bottom.bottom()))
            p.drawText(QRectF(x + 3, r.bottom() + 2, 200, 14), Qt.AlignmentFlag.AlignLeft, f"token {self.first_diff}")
        p.setPen(QPen(text))
        p.drawText(QRectF(r.left(), r.bottom() + 2, 200, 14), Qt.AlignmentFlag.AlignLeft, f"0 … {n - 1}")
        p.end()


COLUMNS = ["#", "A token", "A logprob", "B token", "B logprob", "|Δ logprob|"]


class CompareModel(QAbstractTableModel):
    def __init__(self) -> None:
        super().__init__()
        self.data_: Optional[CompareData] = None

    def set_data(self, data: Optional[CompareData]) -> None:
        self.beginResetModel()
        self.data_ = data
        self.endResetModel()

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: B008 (Qt's signature)
        return 0 if self.data_ is None or parent.isValid() else self.data_.rows

    def columnCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: B008
        return len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal:
            return COLUMNS[section]
        return None

    def data(self, index: QModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if self.data_ is None or not index.isValid():
            return None
        row = self.data_.row(index.row())
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            if col == 0:
                return str(row.index)
            cell = row.a if col in (1, 2) else row.b if col in (3, 4) else None
            if col in (1, 3):
                return "" if cell is None else f"{cell[1]!r}  ({cell[0]})"
            if col in (2, 4):
                return "" if cell is None else f"{cell[2]:.6g}"
            return "" if row.delta is None else f"{row.delta:.3g}"
        if role == Qt.ItemDataRole.BackgroundRole:
            first = self.data_.comparison.first_diff
            if first is not None and row.index == first:
                return QBrush(QColor(207, 34, 46, 110))
            if first is not None and row.index > first:
                return QBrush(QColor(128, 128, 128, 40))
            if row.delta:
                return QBrush(QColor(210, 153, 34, 60))
        if role == Qt.ItemDataRole.TextAlignmentRole and col in (0, 2, 4, 5):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None


class CompareView(QDialog):
    """Pick two replies of the same prompt (or a reply and its cold run) and see where they part."""

    sidesChanged = Signal(int, int)  # message ids of A and B
    coldRequested = Signal(int)  # compare A with a cold run of it

    def __init__(self, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.setObjectName("compareView")
        self.setWindowTitle("Compare replies")
        self.resize(1000, 720)
        self.data: Optional[CompareData] = None
        lay = QVBoxLayout(self)
        pick = QHBoxLayout()
        self.combo_a = QComboBox()
        self.combo_a.setObjectName("compareA")
        self.combo_b = QComboBox()
        self.combo_b.setObjectName("compareB")
        self.cold_button = QPushButton("B = cold run of A")
        self.cold_button.setObjectName("compareColdButton")
        self.cold_button.setToolTip("Generate A again with no cache at all and compare")
        for label, w in (("A", self.combo_a), ("B", self.combo_b)):
            tag = QLabel(label)
            tag.setStyleSheet(f"color: {(COLOR_A if label == 'A' else COLOR_B).name()}; font-weight: bold")
            pick.addWidget(tag)
            pick.addWidget(w, 1)
        pick.addWidget(self.cold_button)
        lay.addLayout(pick)
        self.verdict = QLabel("–")
        self.verdict.setObjectName("compareVerdict")
        self.verdict.setWordWrap(True)
        self.verdict.setStyleSheet("font-size: 15px; font-weight: 600")
        self.prefix = QLabel("")
        self.prefix.setObjectName("comparePrefix")
        self.side_a = QLabel("")
        self.side_a.setObjectName("compareSideA")
        self.side_b = QLabel("")
        self.side_b.setObjectName("compareSideB")
        for w in (self.verdict, self.prefix, self.side_a, self.side_b):
            w.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            lay.addWidget(w)
        split = QSplitter(Qt.Orientation.Vertical)
        self.plot = LogprobPlot()
        split.addWidget(self.plot)
        self.model = CompareModel()
        self.table = QTableView()
        self.table.setObjectName("compareTable")
        self.table.setModel(self.model)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(20)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(3, QHeaderView.ResizeMode.Stretch)
        split.addWidget(self.table)
        split.setSizes([220, 420])
        lay.addWidget(split, 1)
        self._choices: list[int] = []
        self.combo_a.activated.connect(lambda _: self._picked())
        self.combo_b.activated.connect(lambda _: self._picked())
        self.cold_button.clicked.connect(lambda: self._choices and self.coldRequested.emit(self._id(self.combo_a)))

    # -- choices -----------------------------------------------------------------------------------
    def set_choices(self, choices: list[tuple[int, str]], a: int, b: Optional[int]) -> None:
        """The replies to pick from ((message id, label)), with A and B selected (B None: a cold run)."""
        self._choices = [mid for mid, _ in choices]
        for combo, chosen in ((self.combo_a, a), (self.combo_b, b)):
            combo.blockSignals(True)
            combo.clear()
            for mid, label in choices:
                combo.addItem(label, mid)
            if combo is self.combo_b:
                combo.addItem("cold run of A", -1)
            combo.setCurrentIndex(combo.findData(chosen if chosen is not None else -1))
            combo.blockSignals(False)

    def _id(self, combo: QComboBox) -> int:
        return int(combo.currentData())

    def _picked(self) -> None:
        a, b = self._id(self.combo_a), self._id(self.combo_b)
        if b == -1:
            self.coldRequested.emit(a)
        else:
            self.sidesChanged.emit(a, b)

    # -- data ----------------------------------------------------------------------------------------
    def set_busy(self, text: str) -> None:
        self.verdict.setText(text)

    def clear(self, text: str) -> None:
        """Nothing compared yet (a new comparison is on its way): no earlier one's numbers stay
        on screen under its busy line."""
        self.data = None
        self.verdict.setText(text)
        for label in (self.prefix, self.side_a, self.side_b):
            label.setText("")
        self.plot.set_data(None)
        self.model.set_data(None)

    def set_data(self, data: CompareData) -> None:
        self.data = data
        c = data.comparison
        self.verdict.setText(compare_verdict(c, (data.a.mode, data.b.mode)))
        self.prefix.setText(prefix_text(c))
        self.side_a.setText(f"A · {data.a.label}: {side_text(data.a)}")
        self.side_b.setText(f"B · {data.b.label}: {side_text(data.b)}")
        self.plot.set_data(data)
        self.model.set_data(data)
        if c.first_diff is not None and c.first_diff < data.rows:
            index = self.model.index(c.first_diff, 0)
            self.table.selectRow(c.first_diff)
            self.table.scrollTo(index, QAbstractItemView.ScrollHint.PositionAtCenter)
