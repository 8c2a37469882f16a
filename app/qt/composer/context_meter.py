"""The context meter beside the composer: the next prompt (the conversation + the draft being
typed) against the context in force, and a warning before Send when it will not fit.

The label is short ('6,920 / 8,192') and never elided: its minimum width is its text; the bar
sits under it, so the pair is no wider than the label. The warning (`warning`, a wrapped label
the window places above the composer) says what Send will do: leave the oldest turns out, or
refuse the message (app/core/composer/context_budget.py words both).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QProgressBar, QVBoxLayout, QWidget

from app.core.composer.context_budget import ContextBudget
from app.qt.widgets.wrap_label import WrapLabel

if TYPE_CHECKING:
    from app.core.composer.model import Composer


class ContextMeter(QWidget):
    def __init__(self, composer: Optional["Composer"] = None, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.setObjectName("contextMeter")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 0, 0, 0)
        lay.setSpacing(2)
        self.label = QLabel()
        self.label.setObjectName("hint")
        self.label.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.bar = QProgressBar()
        self.bar.setObjectName("contextBar")
        self.bar.setRange(0, 1000)
        self.bar.setTextVisible(False)
        self.bar.setFixedHeight(4)
        self.bar.setMinimumWidth(24)
        lay.addStretch(1)
        lay.addWidget(self.label)
        lay.addWidget(self.bar)
        lay.addStretch(1)
        self.warning = WrapLabel("", self)  # the window places it (above the composer)
        self.warning.setObjectName("contextWarning")
        self.warning.setVisible(False)
        self.budget: Optional[ContextBudget] = None
        self.composer = composer
        self.show_budget(None)
        if composer is not None:
            composer.budget_changed.connect(self.show_budget)

    def show_budget(self, budget: Optional[ContextBudget]) -> None:
        self.budget = budget
        if budget is None:  # nothing to count, or not counted yet (another conversation's count is never shown)
            counting = self.composer is not None and self.composer.counting
            self.bar.setValue(0)
            self.label.setText("…" if counting else "")
            self.setToolTip("Context: counting this conversation…" if counting
                            else "Context: nothing to send to the model yet in this conversation")  # fmt: skip
            self.warning.setVisible(False)
            return
        self.bar.setValue(int(budget.fraction * 1000))
        self.label.setText(budget.text)
        self.setToolTip(budget.tooltip)
        self.setProperty("full", budget.refused)  # red only when Send would be refused
        self.style().unpolish(self.label)
        self.style().polish(self.label)
        self.warning.setText(budget.warning)
        self.warning.setVisible(bool(budget.warning))
