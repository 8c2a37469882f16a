"""What can be done with a reply now, around the composer: Regenerate and New variant (buttons and
menu actions), Send and Stop, and the line saying what Regenerate and New variant use. Bound to
the generation (busy or not), the open conversation (its path, the reply selected, its settings),
the composer (whether the meter says Send would be refused) and the engine link (a server away:
Send waits); each click is an operation (app/core/ops.py). The window lays the buttons out.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QPushButton, QSizePolicy

from app.core import ops
from app.core.chat import Chat
from app.core.conversation.view_models import settings_summary
from app.core.generation.replay import REGENERATE_TIP
from app.qt.composer.composer import Composer
from app.qt.widgets.elided_label import ElidedLabel


def _button(text: str, name: str, tip: str) -> QPushButton:
    b = QPushButton(text)
    b.setObjectName(name)
    b.setToolTip(tip)
    return b


def _action(parent: QObject, text: str, shortcut: str, name: str) -> QAction:
    a = QAction(text, parent)
    a.setShortcuts([QKeySequence(shortcut)])
    a.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
    a.setObjectName(name)
    return a


class ReplyBar(QObject):
    def __init__(self, chat: Chat, composer: Composer, parent: QObject) -> None:
        super().__init__(parent)
        self.chat = chat
        self.regenerate_button = _button("↻ Regenerate", "regenerateButton", REGENERATE_TIP)
        self.new_variant_button = _button("⤳ New variant", "newVariantButton",
                                          "A fresh seed with the current settings (Ctrl+Shift+R)")
        self.send_button = _button("Send", "sendButton", "Send (Enter)")
        self.stop_button = _button("Stop", "stopButton", "Stop the reply (Esc)")
        # What Regenerate and New variant use, on a line of its own: beside the buttons a narrow
        # window (a small screen, the debug dock open) squeezed it to nothing.
        self.summary = ElidedLabel()
        self.summary.setObjectName("hint")
        self.summary.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        # Every shortcut spelled out, never a QKeySequence.StandardKey: those are other chords on
        # other platforms, sometimes two (Delete is also Ctrl+D on X11), and clash unseen.
        self.regenerate_action = _action(parent, "Regenerate", "Ctrl+R", "regenerateAction")
        self.regenerate_action.setToolTip(REGENERATE_TIP)
        self.variant_action = _action(parent, "New variant", "Ctrl+Shift+R", "variantAction")
        self.stop_action = _action(parent, "Stop", "Esc", "stopAction")  # always on: stop() ignores idle presses
        for control, do in ((self.regenerate_button.clicked, self.regenerate), (self.regenerate_action.triggered, self.regenerate),
                            (self.new_variant_button.clicked, self.new_variant), (self.variant_action.triggered, self.new_variant),
                            (self.send_button.clicked, self.send), (self.stop_button.clicked, self.stop),
                            (self.stop_action.triggered, self.stop)):  # fmt: skip
            control.connect(lambda *_, do=do: do())
        composer.submitted.connect(self.send)  # Enter
        chat.generation.started.connect(self.refresh)
        chat.generation.ended.connect(self.refresh)
        chat.conversation.path_changed.connect(self.refresh)
        chat.conversation.selected_changed.connect(self.refresh)
        chat.conversation.settings_changed.connect(self.refresh)
        chat.composer.budget_changed.connect(self.refresh)
        chat.composer.text_changed.connect(self.refresh)
        chat.link.server_changed.connect(self.refresh)
        self.refresh()

    # -- what the user does ----------------------------------------------------------------------
    def send(self) -> None:
        ops.send(self.chat)

    def regenerate(self) -> None:
        ops.regenerate(self.chat, fresh=False)

    def new_variant(self) -> None:
        ops.regenerate(self.chat, fresh=True)

    def stop(self) -> None:
        ops.stop(self.chat)

    # -- what can be done now --------------------------------------------------------------------
    def refresh(self, *_: Any) -> None:
        chat = self.chat
        busy = chat.generation.busy
        server = chat.link.server
        writable = not chat.read_only and chat.link.reachable  # a server gone: Send waits
        has_user = chat.conversation.conv_id is not None and any(vm.role == "user" for vm in chat.conversation.vms)
        for b in (self.regenerate_button, self.new_variant_button, self.regenerate_action, self.variant_action):
            b.setEnabled(writable and not busy and has_user)
        self.stop_button.setEnabled(busy)
        # Send waits (disabled, the reason its tooltip) while the meter says it would be refused or
        # the server is away; the composer stays editable: what is typed is kept.
        why = chat.composer.refusal()
        if server is not None and not server.up:
            why = f"The server is not reachable ({server.error or 'no answer'}): Send works again when it answers"
        self.send_button.setEnabled(not chat.read_only and not busy and not why)
        self.send_button.setToolTip(why or "Send (Enter)")
        selected = chat.conversation.selected
        self.summary.setText(settings_summary(chat.conversation.settings(), selected))
        self.summary.setToolTip(selected.settings_note if selected else "")
