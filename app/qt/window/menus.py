"""The main window's menu bar: every action, its shortcut and object name (app/qt/window/window.py)."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QActionGroup, QKeySequence

from app.core import ops
from app.core.generation.replay import REGENERATE_TIP
from app.qt.engine_link import model_actions
from app.qt.engine_link.server_toggle import ServerToggle

MainWindow = Any  # app/qt/window/window.py's (not imported: the window imports this module)


def build_menus(w: MainWindow) -> None:
    def act(menu: Any, text: str, slot: Any, shortcut: Any = None, name: str = "") -> QAction:
        a = QAction(text, w)
        if shortcut is not None:
            a.setShortcuts(shortcut if isinstance(shortcut, list) else [QKeySequence(shortcut)])
        a.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        a.triggered.connect(slot)
        if name:
            a.setObjectName(name)
        menu.addAction(a)
        return a

    mb = w.menuBar()
    f = mb.addMenu("&File")
    w.new_action = act(f, "New chat", w.new_conversation, "Ctrl+N", "newChatAction")
    act(f, "Import conversation…", w.import_conversation)
    act(f, "Export conversation…", lambda: w.conv_id and w.export_conversation(w.conv_id), "Ctrl+E")
    f.addSeparator()
    act(f, "Quit", w.close, "Ctrl+Q")
    c = mb.addMenu("&Chat")
    w.regenerate_action = act(c, "Regenerate", lambda: ops.regenerate(w.chat, False), "Ctrl+R", "regenerateAction")
    w.regenerate_action.setToolTip(REGENERATE_TIP)
    c.setToolTipsVisible(True)
    w.variant_action = act(c, "New variant", lambda: ops.regenerate(w.chat, True), "Ctrl+Shift+R", "variantAction")
    w.stop_action = act(c, "Stop", lambda: ops.stop(w.chat), "Esc", "stopAction")
    c.addSeparator()
    # Every shortcut spelled out, never a QKeySequence.StandardKey: those are other chords on
    # other platforms, sometimes two (Delete is also Ctrl+D on X11), and clash unseen.
    act(c, "Settings…", w.open_settings, "Ctrl+,")
    act(c, "Search conversations", w.focus_search, "Ctrl+F", "searchAction")  # from anywhere in the window
    v = mb.addMenu("&View")
    w.debug_action = w.debug_panel.toggleViewAction()
    w.debug_action.setText("Debug panel")
    w.debug_action.setObjectName("debugAction")
    w.debug_action.setShortcut(QKeySequence("Ctrl+D"))
    v.addAction(w.debug_action)
    themes = v.addMenu("Theme")
    group = QActionGroup(w)
    for key, label in (("system", "Follow system"), ("light", "Light"), ("dark", "Dark")):
        a = QAction(label, w, checkable=True)
        a.setChecked(w.theme_option == key)
        a.triggered.connect(lambda _=False, k=key: w.set_theme(k))
        group.addAction(a)
        themes.addAction(a)
    m = mb.addMenu("&Models")
    act(m, "Manage models…", w.open_model_manager, "Ctrl+Shift+M", "manageModelsAction")
    # The window's engine on a Verbatim server (one machine or several ranks): app/core/engine_link/server_link.py.
    act(m, "Connect to a Verbatim server…", lambda: model_actions.open_server_dialog(w), name="connectServerAction")
    w.disconnect_action = act(m, "Disconnect from the server", lambda: model_actions.disconnect_server(w),
                              name="disconnectServerAction")
    w.disconnect_action.setEnabled(False)
    # The local OpenAI-compatible server: the loaded model, through this window's worker.
    m.addSeparator()
    w.server_toggle = ServerToggle(w.chat.executor, w)
    w.server_toggle.failed.connect(lambda msg: w.show_error("Cannot start the local server", msg))
    m.addAction(w.server_toggle.action)
    m.addAction(w.server_toggle.share_action)  # off by default: API clients get a cache of their own
    w.statusBar().addPermanentWidget(w.server_toggle.label)
