"""The model picker in the top bar: the model in use, the ones found on this machine, "Manage…"."""

from __future__ import annotations

import logging
from typing import Optional

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QPaintEvent
from PySide6.QtWidgets import QComboBox, QStyle, QStyleOptionComboBox, QStylePainter, QWidget
from shiboken6 import isValid

from app.core.engine_link.models import discover, entry_name, entry_spec
from app.qt import jobs

log = logging.getLogger(__name__)
MANAGE = "__manage__"


class ModelPicker(QComboBox):
    chosen = Signal(str, str)  # spec, display name: a model other than the current one
    manageRequested = Signal()

    def __init__(self, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.setObjectName("modelPicker")
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.setMinimumContentsLength(22)
        self.setToolTip("The model that answers")
        self.spec = ""
        self.name = ""
        self.activated.connect(self._on_activated)

    MIN_WIDTH = 120

    def minimumSizeHint(self) -> QSize:  # type: ignore[override]
        """Wide (22 characters) when there is room, down to MIN_WIDTH in a narrow window (the
        top bar never draws its buttons over the picker)."""
        s = super().minimumSizeHint()
        return QSize(min(s.width(), self.MIN_WIDTH), s.height())

    def shown_text(self) -> str:
        """The current model's name as drawn: elided in the middle when the picker is narrower
        than the name (never cut off at the edge); the whole name is its tooltip."""
        opt = QStyleOptionComboBox()
        self.initStyleOption(opt)
        field = self.style().subControlRect(QStyle.ComplexControl.CC_ComboBox, opt,
                                            QStyle.SubControl.SC_ComboBoxEditField, self)  # fmt: skip
        return self.fontMetrics().elidedText(self.currentText(), Qt.TextElideMode.ElideMiddle, field.width() - 4)

    def paintEvent(self, event: QPaintEvent) -> None:  # type: ignore[override]
        p = QStylePainter(self)
        opt = QStyleOptionComboBox()
        self.initStyleOption(opt)
        p.drawComplexControl(QStyle.ComplexControl.CC_ComboBox, opt)
        opt.currentText = self.shown_text()
        p.drawControl(QStyle.ControlElement.CE_ComboBoxLabel, opt)

    def select(self, spec: str, name: str) -> None:
        """Show `spec` as the current model (added if not listed yet)."""
        self.spec, self.name = spec, name
        i = self.findData(spec)
        if i < 0:
            i = max(self.findData(MANAGE), 0)
            self.insertItem(i, name, spec)
        elif name:
            self.setItemText(i, name)  # e.g. a server's address, then where its model runs
        self.setCurrentIndex(i)
        self.setToolTip(f"The model that answers: {self.currentText()}")
        if self.findData(MANAGE) < 0:
            self.insertSeparator(self.count())
            self.addItem("Manage models…", MANAGE)

    async def refresh(self, extra_dirs: list[str]) -> None:
        """Add the models found on this machine (discovery reads files: a background thread)."""
        try:
            entries = await jobs.in_thread(discover, extra_dirs)
        except Exception as e:
            log.info("model discovery failed: %s", jobs.user_message(e))
            return
        if not isValid(self):  # the window closed meanwhile
            return
        for e in entries:
            spec = entry_spec(e)
            if self.findData(spec) < 0:
                self.insertItem(max(self.findData(MANAGE) - 1, 0), entry_name(e), spec)
        self.select(self.spec, self.name)

    def _on_activated(self, index: int) -> None:
        spec = self.itemData(index)
        if spec == MANAGE:
            self.select(self.spec, self.name)
            self.manageRequested.emit()
        elif spec and spec != self.spec:
            self.chosen.emit(spec, self.itemText(index))
