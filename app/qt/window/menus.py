"""The main window's menu bar: every action, its shortcut and object name. The actions belong to
what they act on (the reply bar's Regenerate / New variant / Stop, the model controls' Disconnect
and local server, the debug dock's toggle); the menus only list them."""

from __future__ import annotations

from typing import Any, Callable

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QMainWindow, QMenu

from app.qt.composer.reply_bar import ReplyBar
from app.qt.conversation.actions import ConversationActions
from app.qt.conversation.settings_dialog import SettingsControl
from app.qt.conversation.sidebar import Sidebar
from app.qt.engine_link.model_actions import ModelControls
from app.qt.inspector.debug_panel import DebugPanel

THEMES = (("system", "Follow system"), ("light", "Light"), ("dark", "Dark"))


class Menus:
    def __init__(self, window: QMainWindow, conversations: ConversationActions, replies: ReplyBar,
                 settings: SettingsControl, sidebar: Sidebar, debug_panel: DebugPanel, models: ModelControls,
                 theme: str, set_theme: Callable[[str], None]) -> None:  # fmt: skip
        self.window = window
        mb = window.menuBar()
        f = mb.addMenu("&File")
        self.new_action = self._act(f, "New chat", conversations.new, "Ctrl+N", "newChatAction")
        self._act(f, "Import conversation…", conversations.import_)
        self._act(f, "Export conversation…", conversations.export_current, "Ctrl+E")
        f.addSeparator()
        self._act(f, "Quit", window.close, "Ctrl+Q")
        c = mb.addMenu("&Chat")
        c.setToolTipsVisible(True)
        for a in (replies.regenerate_action, replies.variant_action, replies.stop_action):
            c.addAction(a)
        c.addSeparator()
        # Every shortcut spelled out, never a QKeySequence.StandardKey: those are other chords on
        # other platforms, sometimes two (Delete is also Ctrl+D on X11), and clash unseen.
        self._act(c, "Settings…", settings.open_dialog, "Ctrl+,")
        self._act(c, "Search conversations", sidebar.focus_search, "Ctrl+F", "searchAction")  # from anywhere
        v = mb.addMenu("&View")
        self.debug_action = debug_panel.toggleViewAction()
        self.debug_action.setText("Debug panel")
        self.debug_action.setObjectName("debugAction")
        self.debug_action.setShortcut(QKeySequence("Ctrl+D"))
        v.addAction(self.debug_action)
        themes = v.addMenu("Theme")
        group = QActionGroup(window)
        for key, label in THEMES:
            a = QAction(label, window, checkable=True)
            a.setChecked(theme == key)
            a.triggered.connect(lambda _=False, k=key: set_theme(k))
            group.addAction(a)
            themes.addAction(a)
        m = mb.addMenu("&Models")
        self._act(m, "Manage models…", models.open_manager, "Ctrl+Shift+M", "manageModelsAction")
        # The window's engine on a Verbatim server (one machine or several ranks).
        self._act(m, "Connect to a Verbatim server…", models.open_server_dialog, name="connectServerAction")
        m.addAction(models.disconnect_action)
        m.addSeparator()
        m.addAction(models.server_toggle.action)
        m.addAction(models.server_toggle.share_action)  # off by default: API clients get a cache of their own

    def _act(self, menu: QMenu, text: str, slot: Callable[[], Any], shortcut: Any = None, name: str = "") -> QAction:
        a = QAction(text, self.window)
        if shortcut is not None:
            a.setShortcuts([QKeySequence(shortcut)])
        a.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        a.triggered.connect(lambda *_: slot())
        if name:
            a.setObjectName(name)
        menu.addAction(a)
        return a
