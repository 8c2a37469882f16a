"""The main window: it builds the chat (app/core/chat.py) and the widgets bound to its sub-models,
and lays them out; it forwards nothing.

Each widget binds to the sub-model it shows and sends what the user does as an operation
(app/core/ops.py): the sidebar to the conversation list (app/qt/conversation/sidebar.py), the chat
view to the open conversation and the generation (app/qt/conversation/chat_view.py), the composer
and the meter to the composer (app/qt/composer/composer.py, context_meter.py), the reply bar's
buttons to what can be done now (app/qt/composer/reply_bar.py), the debug panel to the selected
reply's run (app/qt/inspector/debug_panel.py), the status bar and the notice to the notices
(app/qt/window/status.py, app/qt/widgets/notice.py), the model controls to the engine link
(app/qt/engine_link/model_actions.py). Whole conversations: app/qt/conversation/actions.py;
settings: app/qt/conversation/settings_dialog.py; the menu bar: app/qt/window/menus.py.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Optional

from PySide6.QtCore import QSettings, Qt
from PySide6.QtGui import QCloseEvent, QGuiApplication
from PySide6.QtWidgets import (
    QApplication,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QSizePolicy,
    QSplitter,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core.chat import Chat
from app.core.engine_link.cache_move import move_prompt_cache
from app.core.store import StoreError, open_app_store
from app.core.store.session import ChatSession
from app.qt import jobs
from app.qt.composer.attach import AttachControls
from app.qt.composer.composer import Composer
from app.qt.composer.context_meter import ContextMeter
from app.qt.composer.reply_bar import ReplyBar
from app.qt.conversation.actions import ConversationActions
from app.qt.conversation.chat_view import ChatView
from app.qt.conversation.settings_dialog import SettingsControl, default_settings
from app.qt.conversation.sidebar import Sidebar
from app.qt.engine_link.model_actions import ModelControls
from app.qt.engine_link.model_picker import ModelPicker
from app.qt.inspector.debug_panel import DebugPanel
from app.qt.inspector.inspector import Inspector
from app.qt.theme import Theme, apply_theme, theme_named
from app.qt.widgets.elided_label import ElidedLabel
from app.qt.widgets.notice import Notice
from app.qt.window.dock_width import DockWidth
from app.qt.window.gc_pacer import GcPacer
from app.qt.window.menus import Menus
from app.qt.window.state import WindowState
from app.qt.window.status import StatusLine
from engine.engine import Engine
from engine.executor import EngineExecutor

log = logging.getLogger(__name__)
SHUTDOWN_S = 30.0  # how long closing the window waits for the engine thread
READ_ONLY = ("Another Verbatim window is using this data folder: this one is read-only "
             "(you can read conversations, not send).")


class MainWindow(QMainWindow):
    MIN_SIZE = (800, 600)

    def __init__(
        self,
        model: str,
        data_dir: Path,
        chunk: int = 512,
        use_disk: bool = True,
        theme: Optional[str] = None,
        batch_interval: float = 0.05,
        context_length: Optional[int] = None,
        cache_dir: Optional[Path] = None,
    ) -> None:
        """`cache_dir`: the prompt cache's folder; None keeps it in `data_dir/cache` (tests and
        scripts stay self-contained). `python -m app` with the default data folder passes the
        user cache folder (engine.paths.prompt_cache_dir()) and an old `data_dir/cache` moves there."""
        super().__init__()
        self.setObjectName("mainWindow")
        self.setWindowTitle("Verbatim")
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Settings live in the data dir, never in the user's global QSettings (tests stay isolated).
        self.qsettings = QSettings(str(self.data_dir / "settings.ini"), QSettings.Format.IniFormat)
        store, self.lock = open_app_store(self.data_dir)
        self.read_only = self.lock is None
        self.session = ChatSession(store)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else self.data_dir / "cache"
        if self.cache_dir != self.data_dir / "cache" and not self.read_only:  # the lock holder moves it
            move_prompt_cache(self.data_dir / "cache", self.cache_dir)
        cache_dir_ = self.cache_dir

        def make_engine() -> Engine:  # on the engine thread: at start, and after a server is left
            return Engine(cache_dir=cache_dir_, use_disk=use_disk, chunk=chunk, context_length=context_length)

        self.chat = Chat(self.session, EngineExecutor(make_engine), jobs.gui_loop(), jobs.spawn,
                         lambda: default_settings(self.qsettings), chunk, batch_interval, self.read_only)
        last_local = self.qsettings.value("model/last_local")
        self.chat.link.use_engines(make_engine, last_local if isinstance(last_local, str) and last_local else "demo")
        self.engine_closed = False  # the engine thread ended in time when the window closed
        self._closed = False
        self.state = WindowState(self.qsettings)
        self.chat.conversation.remember_runs(self.state.picked_runs())  # the runs picked before the last quit
        if not self.read_only:
            self.chat.conversation.runs_changed.connect(self.state.keep_picked_runs)
        self.theme_option = os.environ.get("VERBATIM_THEME") or theme or str(self.qsettings.value("view/theme", "system"))
        self.theme: Theme = theme_named(self.theme_option)
        self._build()
        self._apply_theme()
        QGuiApplication.styleHints().colorSchemeChanged.connect(lambda _: self._apply_theme())
        self.state.restore(self, self.splitter, self.dock_width)
        self.chat.conversation.path_changed.connect(lambda _: self._update_title())
        self.chat.listing.items_changed.connect(lambda _: self._update_title())
        self.chat.listing.refresh()
        recent = self.sidebar.ids()
        self.conversations.show(recent[0] if recent else None)
        if self.read_only:
            self.chat.notices.banner(READ_ONLY)
        # Garbage collection on this thread, and a full one only between replies (gc_pacer.py).
        self.gc_pacer = GcPacer(busy=lambda: self.chat.generation.busy, parent=self)
        self.gc_pacer.start()
        self.settings.restore_memory_budget()  # before the load: the engine's tier starts with it
        self.models.load(model)
        self.models.discover()

    # ------------------------------------------------------------------------------------ layout
    def _build(self) -> None:
        chat = self.chat
        self.sidebar = Sidebar(chat)
        self.sidebar.setMinimumWidth(170)

        column = QWidget()
        column.setObjectName("chatColumn")
        col = QVBoxLayout(column)
        col.setContentsMargins(0, 0, 0, 0)
        col.setSpacing(0)

        top = QWidget()
        top.setObjectName("topBar")
        tb = QHBoxLayout(top)
        tb.setContentsMargins(12, 8, 12, 8)
        self.model_picker = ModelPicker()
        tb.addWidget(self.model_picker)
        self.model_status = ElidedLabel("")  # "30 layers · loaded in 1.2 s" elides, never clips
        self.model_status.setObjectName("hint")
        self.model_status.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        tb.addWidget(self.model_status, 1)
        self.settings_button = self._tool("Settings", "settingsButton", "Conversation settings (Ctrl+,)")
        self.debug_button = self._tool("Debug", "debugButton", "Prompt cache debug panel (Ctrl+D)")
        self.debug_button.setCheckable(True)
        tb.addWidget(self.settings_button)
        tb.addWidget(self.debug_button)
        col.addWidget(top)

        self.banner = QLabel()
        self.banner.setObjectName("banner")
        self.banner.setWordWrap(True)
        self.banner.setVisible(False)
        self.banner.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        col.addWidget(self.banner)

        self.chat_view = ChatView(self.theme.code, chat)
        col.addWidget(self.chat_view, 1)

        bottom = QWidget()
        bottom.setObjectName("composerArea")
        bl = QVBoxLayout(bottom)
        bl.setContentsMargins(16, 8, 16, 12)
        bl.setSpacing(6)
        self.notice = Notice(chat.notices)  # an explanation, whole and wrapped, until the next reply
        bl.addWidget(self.notice)
        self.composer = Composer(chat.composer, self.read_only)
        self.reply_bar = ReplyBar(chat, self.composer, self)
        actions = QHBoxLayout()
        actions.addWidget(self.reply_bar.regenerate_button)
        actions.addWidget(self.reply_bar.new_variant_button)
        actions.addStretch(1)
        self.context_meter = ContextMeter(chat.composer)  # right above the composer, in line with Send
        actions.addWidget(self.context_meter)
        bl.addLayout(actions)
        bl.addWidget(self.reply_bar.summary)
        bl.addWidget(self.context_meter.warning)  # what Send will do when the next prompt does not fit
        self.attach = AttachControls(chat, self.qsettings)  # the paperclip, drops, the chips
        bl.addWidget(self.attach.bar)
        row = QHBoxLayout()
        row.addWidget(self.attach.button, 0, Qt.AlignmentFlag.AlignTop)
        row.addWidget(self.composer, 1)
        buttons = QVBoxLayout()
        buttons.addWidget(self.reply_bar.send_button)
        buttons.addWidget(self.reply_bar.stop_button)
        buttons.addStretch(1)
        row.addLayout(buttons)
        bl.addLayout(row)
        col.addWidget(bottom)
        self.attach.watch(self.composer, self.chat_view.viewport())

        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.setObjectName("mainSplitter")
        self.splitter.addWidget(self.sidebar)
        self.splitter.addWidget(column)
        self.splitter.setStretchFactor(0, 0)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([250, 950])
        self.splitter.setChildrenCollapsible(False)
        self.setCentralWidget(self.splitter)

        self.debug_panel = DebugPanel(chat, self)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.debug_panel)
        self.debug_panel.hide()
        self.dock_width = DockWidth(self, self.debug_panel, self._dock_room)  # app/qt/window/dock_width.py
        self.debug_panel.visibilityChanged.connect(self.debug_button.setChecked)
        self.debug_button.toggled.connect(self.debug_panel.setVisible)

        self.status_line = StatusLine(chat, self.statusBar(), self.banner, self)
        self.models = ModelControls(chat, self, self.qsettings, self.model_picker, self.model_status, self.statusBar())
        self.conversations = ConversationActions(chat, self, self.qsettings, self.sidebar, self.chat_view, self.composer)
        self.settings = SettingsControl(chat, self, self.qsettings)
        self.settings_button.clicked.connect(self.settings.open_dialog)
        self.inspector = Inspector(chat, self.chat_view, self.debug_panel, self, self.qsettings)  # compare, tokens, receipts
        self.menus = Menus(self, self.conversations, self.reply_bar, self.settings, self.sidebar, self.debug_panel,
                           self.models, self.theme_option, self.set_theme)  # fmt: skip
        self.setMinimumSize(*self.MIN_SIZE)  # what the layout checks (tests/gui/xcb_window_checks.py) cover
        self.resize(1200, 800)

    @staticmethod
    def _tool(text: str, name: str, tip: str) -> QToolButton:
        b = QToolButton()
        b.setText(text)
        b.setObjectName(name)
        b.setToolTip(tip)
        return b

    def _dock_room(self) -> int:
        return self.width() - self.sidebar.width() - self.splitter.widget(1).minimumSizeHint().width() - 16

    def _update_title(self) -> None:
        title = "Verbatim"
        conv_id = self.chat.conversation.conv_id
        if conv_id is not None and not self._closed:
            try:
                title = f"{self.session.title(conv_id)} — Verbatim"
            except StoreError:
                pass
        if not self._closed:
            self.setWindowTitle(title)

    # ------------------------------------------------------------------------------------ theme
    def set_theme(self, option: str) -> None:
        self.theme_option = option
        self.qsettings.setValue("view/theme", option)
        self._apply_theme()

    def _apply_theme(self) -> None:
        self.theme = theme_named(self.theme_option)
        app = QApplication.instance()
        if isinstance(app, QApplication):
            apply_theme(app, self.theme)
        self.chat_view.set_palette(self.theme.code)

    # -------------------------------------------------------------------------------- shutdown
    def closeEvent(self, event: QCloseEvent) -> None:  # type: ignore[override]
        if not self._closed:
            self.shutdown()
        event.accept()

    def shutdown(self) -> None:
        """Stop generating (the reply in progress is saved as interrupted), stop the engine
        thread, close the store and release the data dir."""
        if self._closed:
            return
        self._closed = True
        self.gc_pacer.stop()
        self.sidebar.stop()  # a search typed just before closing must not reach the closed store
        self.chat.composer.save()  # what was typed and not sent is there at the next start
        try:
            self.state.save(self, self.splitter)
        except Exception:
            log.exception("cannot save the window geometry")
        self.models.stop()  # the local server's generations stop before the engine thread does
        self.engine_closed = self.chat.shutdown(SHUTDOWN_S)
        if self.engine_closed:  # a stuck engine thread may still write: leave the store to exit
            self.session.close()
        if self.lock is not None:
            self.lock.release()
