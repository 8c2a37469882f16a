"""Conversation settings: system prompt, sampler, seed, exact / fast mode: the dialog, and how the
window applies them (`SettingsControl`: to the open conversation through app/core/ops.py, and as
the defaults a new chat starts with, kept in settings.ini). Also the app's memory (not the
conversation's): the prompt cache's memory budget and what it holds now, with the process's
memory split (EngineLink.memory_report); a budget set here is applied at once (EngineLink.
set_memory_budget), kept in settings.ini ("engine/memory_budget") and applied again at start."""

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
    QGroupBox,
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
from app.core.engine_link.memory_text import memory_now_text, memory_split_text
from engine.memory import MIB, MemoryReport, default_memory_budget, physical_memory

MEMORY_BUDGET_KEY = "engine/memory_budget"  # settings.ini: the memory tier's budget in bytes (absent: the default)

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
                 template_system: Optional[str] = None, memory_budget: Optional[int] = None,
                 memory: Optional[MemoryReport] = None, remote: bool = False) -> None:  # fmt: skip
        """`template_system`: the model's template's own system prompt ('' none, None unknown);
        `memory_budget`: the memory tier's budget set (None: the default); `memory`: the process's
        memory as last read; `remote`: attached to a server (whose memory is its own)."""
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
        lay.addWidget(self._memory_box(memory_budget, remote))
        self.show_memory(memory, remote)
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

    def _memory_box(self, budget: Optional[int], remote: bool) -> QGroupBox:
        """The app's memory, for every conversation: the prompt cache's budget in memory, what it
        holds now and where the process's memory is."""
        box = QGroupBox("Memory (the app's, for every conversation)")
        box.setObjectName("memoryBox")
        form = QFormLayout(box)
        self.memory_budget = QSpinBox()
        self.memory_budget.setObjectName("memoryBudget")
        top = max(physical_memory() // MIB, 64 * 1024)
        self.memory_budget.setRange(0, top)
        self.memory_budget.setSingleStep(256)
        self.memory_budget.setSuffix(" MB")
        default = round(default_memory_budget() / MIB)
        self.memory_budget.setSpecialValueText(f"default ({default:,} MB for this machine)")
        self.memory_budget.setValue(0 if budget is None else max(budget // MIB, 1))
        self.memory_budget.setToolTip("Replies restore their conversation from the prompt cache: in memory up to "
                                      "this budget (the oldest snapshots go first), then from the disk. "
                                      f"The default is a sixteenth of this machine's memory ({default:,} MB).")
        self.memory_budget.setEnabled(not remote)
        form.addRow("Prompt cache in memory", self.memory_budget)
        self.memory_now = QLabel()
        self.memory_now.setObjectName("memoryNow")
        self.memory_now.setWordWrap(True)
        form.addRow("", self.memory_now)
        self.memory_split = QLabel()
        self.memory_split.setObjectName("memorySplit")
        self.memory_split.setWordWrap(True)
        form.addRow("This process", self.memory_split)
        return box

    def show_memory(self, memory: Optional[MemoryReport], remote: bool = False) -> None:
        """What the prompt cache holds in memory now, and the process's memory split."""
        self.memory_now.setText(memory_now_text(memory, remote))
        self.memory_split.setText(memory_split_text(memory, remote))

    def memory_budget_value(self) -> Optional[int]:
        """The budget asked for, in bytes (None: the default)."""
        mb = self.memory_budget.value()
        return mb * MIB if mb else None

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


def stored_memory_budget(qsettings: QSettings) -> Optional[int]:
    """The memory tier's budget kept in settings.ini (None: the default, or unreadable)."""
    raw = qsettings.value(MEMORY_BUDGET_KEY)
    try:
        n = int(raw) if raw is not None else 0
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None


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
        link = self.chat.link
        remote = link.server is not None
        dlg = SettingsDialog(self.chat.conversation.settings(), self.parent, link.template_system,
                             link.memory_budget, link.memory_report, remote)
        shown = lambda memory: dlg.show_memory(memory, link.server is not None)  # noqa: E731
        link.memory_changed.connect(shown)
        self.chat.jobs.spawn(link.refresh_stats())  # what the memory holds now, while the dialog is open
        try:
            if dlg.exec():
                self.apply(dlg.value(), dlg.as_default.isChecked())
                if not remote and dlg.memory_budget_value() != link.memory_budget:
                    self.set_memory_budget(dlg.memory_budget_value())
        finally:
            link.memory_changed.disconnect(shown)
            dlg.deleteLater()  # a child of the window: it would stay until the window goes (soak test)

    def set_memory_budget(self, budget: Optional[int]) -> None:
        """The memory tier's budget (bytes; None: the default), applied at once and kept for the
        next start."""
        if budget is None:
            self.qsettings.remove(MEMORY_BUDGET_KEY)
        else:
            self.qsettings.setValue(MEMORY_BUDGET_KEY, int(budget))
        self.chat.link.set_memory_budget(budget)

    def restore_memory_budget(self) -> None:
        """At start: the budget kept in settings.ini, if any (else the engine's default stays)."""
        budget = stored_memory_budget(self.qsettings)
        if budget is not None:
            self.chat.link.set_memory_budget(budget)
