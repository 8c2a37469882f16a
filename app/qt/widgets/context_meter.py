"""The context meter beside the composer: how much of the model's context the conversation uses."""

from __future__ import annotations

from typing import Optional

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QProgressBar, QWidget

from app.core.view_models import ContextVM
from app.qt.widgets.elided_label import ElidedLabel


def _short(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 10_000 else f"{n:,}"


class ContextMeter(QWidget):
    def __init__(self, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.setObjectName("contextMeter")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(4, 0, 0, 0)
        lay.setSpacing(4)
        # Both parts shrink rather than widen the composer's row past a small window.
        self.label = ElidedLabel()
        self.label.MIN_CHARS = 2
        self.label.setObjectName("hint")
        self.label.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.bar = QProgressBar()
        self.bar.setObjectName("contextBar")
        self.bar.setRange(0, 1000)
        self.bar.setTextVisible(False)
        self.bar.setFixedHeight(6)
        self.bar.setMinimumWidth(24)
        self.bar.setMaximumWidth(64)
        lay.addWidget(self.label)
        lay.addWidget(self.bar, 0, Qt.AlignmentFlag.AlignVCenter)
        self.vm: Optional[ContextVM] = None
        self.show_context(None)

    def show_context(self, vm: Optional[ContextVM]) -> None:
        self.vm = vm
        if vm is None:
            self.bar.setValue(0)
            self.label.setText("")
            self.setToolTip("Context: nothing sent to the model yet in this conversation")
            return
        self.bar.setValue(int(vm.fraction * 1000))
        self.label.setText(f"{_short(vm.used)} / {_short(vm.limit)} tokens" if vm.limit else f"{_short(vm.used)} tokens")
        tip = f"Context: {vm.text} used by the last prompt and its reply"
        if vm.dropped:
            tip += f"\n{vm.marker}"
        self.setToolTip(tip)
