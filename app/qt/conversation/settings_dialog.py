"""Conversation settings: system prompt, sampler, seed, exact / fast mode: the dialog, and how the
window applies them (`SettingsControl`: to the open conversation through app/core/ops.py, and as
the defaults a new chat starts with, kept in settings.ini)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Optional

from PySide6.QtCore import QSettings

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QPlainTextEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.core import ops
from app.core.chat import Chat
from app.core.store import ChatSettings
from app.core.engine_link.template_default import placeholder

MODE_HELP = {
    "exact": "Exact: every reply is bit-identical to a run with no cache (the previous reply is re-read).",
    "fast": "Fast: reuses the cached previous reply too; same tokens in practice, low bits may differ.",
}


def _dspin(lo: float, hi: float, step: float, decimals: int = 2) -> QDoubleSpinBox:
    s = QDoubleSpinBox()
    s.setRange(lo, hi)
    s.setSingleStep(step)
    s.setDecimals(decimals)
    return s


class SettingsDialog(QDialog):
    def __init__(self, settings: ChatSettings, parent: Optional[QWidget] = None,
                 template_system: Optional[str] = None) -> None:  # fmt: skip
        """`template_system`: the model's template's own system prompt ('' none, None unknown)."""
        super().__init__(parent)
        self.setObjectName("settingsDialog")
        self.setWindowTitle("Conversation settings")
        self.setMinimumWidth(460)
        lay = QVBoxLayout(self)
        form = QFormLayout()
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setObjectName("systemPrompt")
        self.system_prompt.setPlaceholderText(placeholder(template_system))  # what the model gets meanwhile
        self.system_prompt.setFixedHeight(90)
        form.addRow("System prompt", self.system_prompt)
        self.temperature = _dspin(0.0, 2.0, 0.05)
        self.temperature.setObjectName("temperature")
        form.addRow("Temperature", self.temperature)
        self.top_p = _dspin(0.0, 1.0, 0.05)
        form.addRow("Top-p", self.top_p)
        self.top_k = QSpinBox()
        self.top_k.setRange(0, 100000)
        self.top_k.setSpecialValueText("off")
        form.addRow("Top-k", self.top_k)
        self.min_p = _dspin(0.0, 1.0, 0.01)
        form.addRow("Min-p", self.min_p)
        self.repetition_penalty = _dspin(1.0, 2.0, 0.05)
        form.addRow("Repetition penalty", self.repetition_penalty)
        self.max_tokens = QSpinBox()
        self.max_tokens.setObjectName("maxTokens")
        self.max_tokens.setRange(1, 131072)
        form.addRow("Max tokens", self.max_tokens)
        self.random_seed = QCheckBox("New random seed for every reply")
        self.seed = QSpinBox()
        self.seed.setObjectName("seed")
        self.seed.setRange(0, 2**31 - 1)
        self.random_seed.toggled.connect(lambda on: self.seed.setEnabled(not on))
        form.addRow("Seed", self.random_seed)
        form.addRow("", self.seed)
        self.mode = QComboBox()
        self.mode.setObjectName("mode")
        self.mode.addItem("Exact", "exact")
        self.mode.addItem("Fast", "fast")
        self.mode_help = QLabel()
        self.mode_help.setWordWrap(True)
        self.mode_help.setObjectName("hint")
        self.mode.currentIndexChanged.connect(lambda _: self.mode_help.setText(MODE_HELP[self.mode.currentData()]))
        form.addRow("Mode", self.mode)
        form.addRow("", self.mode_help)
        self.context_policy = QComboBox()
        self.context_policy.setObjectName("contextPolicy")
        self.context_policy.addItem("Leave out the oldest messages", "truncate")
        self.context_policy.addItem("Refuse to send", "refuse")
        self.context_policy.setToolTip("What to do when the conversation no longer fits the model's context")
        form.addRow("Too long", self.context_policy)
        self.context_length = QSpinBox()
        self.context_length.setObjectName("contextLength")
        self.context_length.setRange(0, 1 << 20)
        self.context_length.setSingleStep(256)
        self.context_length.setSpecialValueText("the model's own")
        self.context_length.setSuffix(" tokens")
        self.context_length.setToolTip("Use at most this much of the model's context (never more than the model's own)")
        form.addRow("Context limit", self.context_length)
        lay.addLayout(form)
        self.as_default = QCheckBox("Use these settings for new conversations")
        self.as_default.setChecked(True)
        lay.addWidget(self.as_default)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok
            | QDialogButtonBox.StandardButton.Cancel
            | QDialogButtonBox.StandardButton.RestoreDefaults
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        buttons.button(QDialogButtonBox.StandardButton.RestoreDefaults).clicked.connect(
            lambda: self.set_value(ChatSettings())
        )
        lay.addWidget(buttons)
        self.set_value(settings)

    def set_value(self, s: ChatSettings) -> None:
        self._base = s.sampler  # keeps knobs the dialog does not show (repetition_context)
        self.system_prompt.setPlainText(s.system_prompt)
        self.temperature.setValue(s.sampler.temperature)
        self.top_p.setValue(s.sampler.top_p)
        self.top_k.setValue(s.sampler.top_k)
        self.min_p.setValue(s.sampler.min_p)
        self.repetition_penalty.setValue(s.sampler.repetition_penalty)
        self.max_tokens.setValue(s.sampler.max_tokens)
        self.random_seed.setChecked(s.random_seed)
        self.seed.setValue(s.sampler.seed)
        self.seed.setEnabled(not s.random_seed)
        self.mode.setCurrentIndex(max(self.mode.findData(s.mode), 0))
        self.mode_help.setText(MODE_HELP[self.mode.currentData()])
        self.context_policy.setCurrentIndex(max(self.context_policy.findData(s.context_policy), 0))
        self.context_length.setValue(s.context_length)

    def value(self) -> ChatSettings:
        sampler = replace(
            self._base,
            temperature=round(self.temperature.value(), 4),
            top_p=round(self.top_p.value(), 4),
            top_k=self.top_k.value(),
            min_p=round(self.min_p.value(), 4),
            repetition_penalty=round(self.repetition_penalty.value(), 4),
            max_tokens=self.max_tokens.value(),
            seed=self.seed.value(),
        )
        return ChatSettings(
            system_prompt=self.system_prompt.toPlainText().strip(),
            sampler=sampler,
            random_seed=self.random_seed.isChecked(),
            mode=self.mode.currentData(),
            context_policy=self.context_policy.currentData(),
            context_length=self.context_length.value(),
        )


def default_settings(qsettings: QSettings) -> ChatSettings:
    """The settings a new chat starts with (settings.ini's "chat/defaults"; as built when unreadable)."""
    raw = qsettings.value("chat/defaults")
    try:
        return ChatSettings.from_dict(json.loads(raw)) if isinstance(raw, str) else ChatSettings()
    except (ValueError, TypeError):
        return ChatSettings()


class SettingsControl:
    """The window's Settings: the dialog (Ctrl+,), and settings applied to the open conversation
    and, when asked (or in a new chat), kept as the defaults of new chats."""

    def __init__(self, chat: Chat, parent: QWidget, qsettings: QSettings) -> None:
        self.chat, self.parent, self.qsettings = chat, parent, qsettings

    def apply(self, settings: ChatSettings, as_default: bool = True) -> None:
        conv_id = self.chat.conversation.conv_id
        if as_default or conv_id is None:
            # A context limit is the conversation's own: new chats start with the model's context.
            default = settings if conv_id is None else replace(settings, context_length=0)
            self.qsettings.setValue("chat/defaults", json.dumps(default.to_dict()))
        ops.apply_settings(self.chat, settings)

    def open_dialog(self) -> None:
        dlg = SettingsDialog(self.chat.conversation.settings(), self.parent, self.chat.link.template_system)
        try:
            if dlg.exec():
                self.apply(dlg.value(), dlg.as_default.isChecked())
        finally:
            dlg.deleteLater()  # a child of the window: it would stay until the window goes (soak test)
