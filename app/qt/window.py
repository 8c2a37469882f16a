"""The main window: layout, menus, and what the window shows; no chat logic and no background work.

User actions go to `ChatController` (app/qt/controller.py: generation state and the coroutines
that wait on the engine) or, for conversations, to `ChatSession` (app/core/session.py: the only
way to the store). Dialogs live in app/qt/dialogs.py, model discovery in the model picker.

Over ~400 lines (~580), for now: the layout is built in one place (`_build_ui`, ~150 lines, so the
widget tree reads top to bottom in the order it appears on screen), and the window still holds
what the controller shows (`show_model_*`, `refresh_messages`) and the conversation actions
(rename, delete, export, import: each a dialog plus one ChatSession call). Candidates to move
next: the composer area into widgets/composer.py, the conversation actions into their own module.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Optional

import psutil
from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer
from PySide6.QtGui import (
    QAction,
    QActionGroup,
    QCloseEvent,
    QGuiApplication,
    QKeySequence,
)
from PySide6.QtWidgets import (
    QApplication,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QSizePolicy,
    QSplitter,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core.cache_move import move_prompt_cache
from app.core.context_budget import BudgetRequests, budget_requests
from app.core.drafts import Drafts
from app.core.import_hint import import_error_text
from app.core.models import model_label
from app.core.session import ChatSession, ChatSettings
from app.core.store import ConversationStore, StoreError, open_app_store
from app.core.view_models import MessageVM, context_marker, format_bytes
from app.qt import dialogs, jobs
from app.qt.controller import ChatController
from app.qt.draft_counter import DraftCounter
from app.qt.gc_pacer import GcPacer
from app.qt.inspector import Inspector
from app.qt.server_toggle import ServerToggle
from app.qt.theme import Theme, apply_theme, theme_named
from app.qt.widgets.chat_view import ChatView
from app.qt.widgets.composer import Composer
from app.qt.widgets.context_meter import ContextMeter
from app.qt.widgets.debug_panel import DebugPanel
from app.qt.widgets.elided_label import ElidedLabel
from app.qt.widgets.model_picker import ModelPicker
from app.qt.widgets.sidebar import Sidebar
from engine.engine import ModelInfo

log = logging.getLogger(__name__)


class MainWindow(QMainWindow):
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
        store: ConversationStore
        store, self.lock = open_app_store(self.data_dir)
        self.read_only = self.lock is None
        self.session = ChatSession(store)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else self.data_dir / "cache"
        if self.cache_dir != self.data_dir / "cache" and not self.read_only:  # the lock holder moves it
            move_prompt_cache(self.data_dir / "cache", self.cache_dir)
        self.controller = ChatController(
            self, self.session, self.cache_dir, chunk, use_disk, batch_interval, self.read_only,
            context_length,
        )
        self.conv_id: Optional[int] = None
        self.last_error: Optional[str] = None
        self._closed = False
        self._search_seq = 0
        self._search_job: Optional[Any] = None
        self._discovery: Optional[Any] = None
        self.theme_option = os.environ.get("VERBATIM_THEME") or theme or str(self.qsettings.value("view/theme", "system"))
        self.theme: Theme = theme_named(self.theme_option)

        self._build_ui()
        # issue 19 (ui): each conversation keeps its draft; the meter counts the draft as it is
        # typed, on the engine thread, debounced (app/qt/draft_counter.py).
        self.drafts = Drafts()
        self.draft_counter = DraftCounter(self.controller.executor, self.budget_requests, self)
        self.draft_counter.counted.connect(self.context_meter.show_budget)
        self.composer.textChanged.connect(self.draft_counter.schedule)
        self.inspector = Inspector(self)  # compare view, per-token view, receipts (app/qt/inspector.py)
        self._build_menus()
        self._apply_theme()
        QGuiApplication.styleHints().colorSchemeChanged.connect(lambda _: self._apply_theme())
        self._restore_geometry()
        self.refresh_conversations()
        recent = self.sidebar.ids()
        if recent:
            self.open_conversation(recent[0])
        else:
            self.show_conversation(None)
        if self.read_only:
            self.banner_text(
                "Another Verbatim window is using this data folder: this one is read-only "
                "(you can read conversations, not send)."
            )
        # Garbage collection on this thread, and a full one only between replies (gc_pacer.py).
        self.gc_pacer = GcPacer(busy=lambda: self.controller.generating, parent=self)
        self.gc_pacer.start()
        self.controller.load_model(model, model_label(model))
        self.discover_models()
        self._process = psutil.Process()
        self._mem_timer = QTimer(self)
        self._mem_timer.timeout.connect(self.update_memory)
        self._mem_timer.start(2000)
        self.update_memory()
        self._update_actions()

    # ------------------------------------------------------------------------------------ UI
    def _build_ui(self) -> None:
        self.sidebar = Sidebar()
        self.sidebar.selected.connect(self.open_conversation)
        self.sidebar.newRequested.connect(self.new_conversation)
        self.sidebar.renameRequested.connect(self.ask_rename)
        self.sidebar.deleteRequested.connect(lambda cid: self.delete_conversation(cid, confirm=True))
        self.sidebar.exportRequested.connect(self.export_conversation)
        self.sidebar.searchChanged.connect(lambda _: self.refresh_conversations())

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
        self.model_picker.chosen.connect(lambda spec, name: self.controller.load_model(spec, name))
        self.model_picker.manageRequested.connect(self.open_model_manager)
        tb.addWidget(self.model_picker)
        self.model_status = ElidedLabel("")  # "30 layers · loaded in 1.2 s" elides, never clips
        self.model_status.setObjectName("hint")
        self.model_status.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        tb.addWidget(self.model_status, 1)
        self.settings_button = QToolButton()
        self.settings_button.setText("Settings")
        self.settings_button.setObjectName("settingsButton")
        self.settings_button.setToolTip("Conversation settings (Ctrl+,)")
        self.settings_button.clicked.connect(self.open_settings)
        self.debug_button = QToolButton()
        self.debug_button.setText("Debug")
        self.debug_button.setObjectName("debugButton")
        self.debug_button.setCheckable(True)
        self.debug_button.setToolTip("Prompt cache debug panel (Ctrl+D)")
        tb.addWidget(self.settings_button)
        tb.addWidget(self.debug_button)
        col.addWidget(top)

        self.banner = QLabel()
        self.banner.setObjectName("banner")
        self.banner.setWordWrap(True)
        self.banner.setVisible(False)
        self.banner.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        col.addWidget(self.banner)

        self.chat_view = ChatView(self.theme.code)
        self.chat_view.selected.connect(self._on_message_selected)
        self.chat_view.navigate.connect(self.switch_variant)
        self.chat_view.editSubmitted.connect(lambda mid, text: self.controller.edit(mid, text))
        self.chat_view.deleteRequested.connect(lambda mid: self.delete_message(mid, confirm=True))
        self.chat_view.copied.connect(lambda msg: self.statusBar().showMessage(msg, 2000))
        col.addWidget(self.chat_view, 1)

        bottom = QWidget()
        bottom.setObjectName("composerArea")
        bl = QVBoxLayout(bottom)
        bl.setContentsMargins(16, 8, 16, 12)
        bl.setSpacing(6)
        actions = QHBoxLayout()
        self.regenerate_button = QPushButton("↻ Regenerate")
        self.regenerate_button.setObjectName("regenerateButton")
        self.regenerate_button.setToolTip("Same seed and settings: reproduces the reply (Ctrl+R)")
        self.regenerate_button.clicked.connect(lambda: self.controller.regenerate(fresh=False))
        self.new_variant_button = QPushButton("⤳ New variant")
        self.new_variant_button.setObjectName("newVariantButton")
        self.new_variant_button.setToolTip("A fresh seed with the current settings (Ctrl+Shift+R)")
        self.new_variant_button.clicked.connect(lambda: self.controller.regenerate(fresh=True))
        actions.addWidget(self.regenerate_button)
        actions.addWidget(self.new_variant_button)
        self.settings_summary = ElidedLabel()
        self.settings_summary.setObjectName("hint")
        self.settings_summary.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.settings_summary.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        actions.addWidget(self.settings_summary, 1)
        self.context_meter = ContextMeter()  # right above the composer, in line with Send
        actions.addWidget(self.context_meter)
        bl.addLayout(actions)
        bl.addWidget(self.context_meter.warning)  # issue 19 (ui): what Send will do when it does not fit
        row = QHBoxLayout()
        self.composer = Composer()
        self.composer.submitted.connect(self.send)
        row.addWidget(self.composer, 1)
        buttons = QVBoxLayout()
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("sendButton")
        self.send_button.setToolTip("Send (Enter)")
        self.send_button.clicked.connect(self.send)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setObjectName("stopButton")
        self.stop_button.setToolTip("Stop the reply (Esc)")
        self.stop_button.clicked.connect(lambda: self.controller.stop())
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch(1)
        row.addLayout(buttons)
        bl.addLayout(row)
        col.addWidget(bottom)

        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.setObjectName("mainSplitter")
        self.splitter.addWidget(self.sidebar)
        self.splitter.addWidget(column)
        self.splitter.setStretchFactor(0, 0)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([250, 950])
        self.sidebar.setMinimumWidth(170)
        self.splitter.setChildrenCollapsible(False)
        self.setCentralWidget(self.splitter)


        self.debug_panel = DebugPanel(self)
        self.debug_panel.verifyRequested.connect(lambda rid: self.controller.verify(rid))
        self.debug_panel.clearRequested.connect(lambda: self.controller.clear_cache())
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.debug_panel)
        # Narrow enough that sidebar + chat + dock fit an 800 px window; opens at DOCK_WIDTH.
        self.debug_panel.setMinimumWidth(self.DOCK_MIN_WIDTH)
        self.debug_panel.hide()
        self._dock_sized = False
        self.debug_panel.visibilityChanged.connect(self.debug_button.setChecked)
        self.debug_panel.visibilityChanged.connect(self._size_dock)
        self.debug_button.toggled.connect(self.debug_panel.setVisible)

        sb = self.statusBar()
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setMaximumWidth(180)
        self.progress.setTextVisible(False)
        self.progress.setVisible(False)
        self.model_label = QLabel()
        self.model_label.setObjectName("statusModel")
        self.memory_label = QLabel()
        self.memory_label.setObjectName("statusMemory")
        sb.addPermanentWidget(self.progress)
        sb.addPermanentWidget(self.model_label)
        sb.addPermanentWidget(self.memory_label)
        self.resize(1200, 800)

    DOCK_MIN_WIDTH, DOCK_WIDTH = 260, 360

    def _size_dock(self, visible: bool) -> None:
        """The first time the dock opens (no saved window state): its default width, at most
        what leaves the chat column its own minimum."""
        if not visible or self._dock_sized:
            return
        self._dock_sized = True
        room = self.width() - self.sidebar.width() - self.splitter.widget(1).minimumSizeHint().width() - 16
        width = max(self.DOCK_MIN_WIDTH, min(self.DOCK_WIDTH, room))
        self.resizeDocks([self.debug_panel], [width], Qt.Orientation.Horizontal)

    def _build_menus(self) -> None:
        def act(menu: Any, text: str, slot: Any, shortcut: Any = None, name: str = "") -> QAction:
            a = QAction(text, self)
            if shortcut is not None:
                a.setShortcuts(shortcut if isinstance(shortcut, list) else [QKeySequence(shortcut)])
            a.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
            a.triggered.connect(slot)
            if name:
                a.setObjectName(name)
            menu.addAction(a)
            return a

        mb = self.menuBar()
        f = mb.addMenu("&File")
        self.new_action = act(f, "New chat", self.new_conversation, "Ctrl+N", "newChatAction")
        act(f, "Import conversation…", self.import_conversation)
        act(f, "Export conversation…", lambda: self.conv_id and self.export_conversation(self.conv_id), "Ctrl+E")
        f.addSeparator()
        act(f, "Quit", self.close, "Ctrl+Q")
        c = mb.addMenu("&Chat")
        self.regenerate_action = act(c, "Regenerate", lambda: self.controller.regenerate(False), "Ctrl+R", "regenerateAction")
        self.variant_action = act(c, "New variant", lambda: self.controller.regenerate(True), "Ctrl+Shift+R", "variantAction")
        self.stop_action = act(c, "Stop", lambda: self.controller.stop(), "Esc", "stopAction")
        c.addSeparator()
        # Every shortcut spelled out, never a QKeySequence.StandardKey: those are other chords on
        # other platforms, sometimes two (Delete is also Ctrl+D on X11), and clash unseen.
        act(c, "Settings…", self.open_settings, "Ctrl+,")
        # issue 19 (ui): Ctrl+F goes to the conversation search from anywhere in the window.
        act(c, "Search conversations", self.focus_search, "Ctrl+F", "searchAction")
        v = mb.addMenu("&View")
        self.debug_action = self.debug_panel.toggleViewAction()
        self.debug_action.setText("Debug panel")
        self.debug_action.setObjectName("debugAction")
        self.debug_action.setShortcut(QKeySequence("Ctrl+D"))
        v.addAction(self.debug_action)
        themes = v.addMenu("Theme")
        group = QActionGroup(self)
        for key, label in (("system", "Follow system"), ("light", "Light"), ("dark", "Dark")):
            a = QAction(label, self, checkable=True)
            a.setChecked(self.theme_option == key)
            a.triggered.connect(lambda _=False, k=key: self.set_theme(k))
            group.addAction(a)
            themes.addAction(a)
        m = mb.addMenu("&Models")
        act(m, "Manage models…", self.open_model_manager, "Ctrl+Shift+M", "manageModelsAction")
        # The local OpenAI-compatible server: the loaded model, through this window's worker.
        m.addSeparator()
        self.server_toggle = ServerToggle(self.controller.executor, self)
        self.server_toggle.failed.connect(lambda msg: self.show_error("Cannot start the local server", msg))
        m.addAction(self.server_toggle.action)
        self.statusBar().addPermanentWidget(self.server_toggle.label)

    # ---------------------------------------------------------------------------- theme, geometry
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

    def _restore_geometry(self) -> None:
        geo = self.qsettings.value("window/geometry")
        if isinstance(geo, QByteArray) and not geo.isEmpty():
            self.restoreGeometry(geo)
        state = self.qsettings.value("window/state")
        if isinstance(state, QByteArray) and not state.isEmpty():
            self._dock_sized = self.restoreState(state)  # the user's dock width, if any
        split = self.qsettings.value("window/splitter")
        if isinstance(split, QByteArray) and not split.isEmpty():
            self.splitter.restoreState(split)

    def _save_geometry(self) -> None:
        self.qsettings.setValue("window/geometry", self.saveGeometry())
        self.qsettings.setValue("window/state", self.saveState())
        self.qsettings.setValue("window/splitter", self.splitter.saveState())
        self.qsettings.sync()

    # ------------------------------------------------------------------------- what is shown
    def status(self, text: str, ms: int = 0) -> None:
        self.statusBar().showMessage(text, ms)

    def banner_text(self, text: str) -> None:
        self.banner.setText(text)
        self.banner.setVisible(bool(text))

    def show_error(self, title: str, text: str) -> QMessageBox:
        self.last_error = text
        self.status(f"{title}: {text}", 10000)
        return dialogs.error_box(self, title, text)

    def _update_actions(self) -> None:
        busy = self.controller.generating
        can_write = not self.read_only
        has_conv = self.conv_id is not None
        path_has_user = any(w.vm.role == "user" for w in self.chat_view.message_widgets())
        self.send_button.setEnabled(can_write and not busy)
        self.stop_button.setEnabled(busy)
        self.stop_action.setEnabled(True)  # Esc must always reach stop(); it ignores idle presses
        for b in (self.regenerate_button, self.new_variant_button, self.regenerate_action, self.variant_action):
            b.setEnabled(can_write and not busy and has_conv and path_has_user)
        self.composer.setReadOnly(not can_write)
        s = self.current_settings()
        seed = "random seed" if s.random_seed else f"seed {s.sampler.seed}"
        self.settings_summary.setText(f"{s.mode} · T {s.sampler.temperature:g} · {seed} · max {s.sampler.max_tokens}")

    def _update_title(self) -> None:
        title = "Verbatim"
        if self.conv_id is not None:
            try:
                title = f"{self.session.title(self.conv_id)} — Verbatim"
            except StoreError:
                pass
        self.setWindowTitle(title)

    def refresh_conversations(self) -> None:
        """The conversation list; a search runs on a thread (the FTS5 index; the GUI stays live)
        and only the latest one's results are shown."""
        self._update_title()
        self._search_seq += 1
        query = self.sidebar.search.text().strip()
        if not query:
            self.sidebar.set_items(self.session.conversation_items(""), self.conv_id)
            return
        self._search_job = jobs.spawn(self._search(query, self._search_seq))

    async def _search(self, query: str, seq: int) -> None:
        try:
            items = await jobs.in_thread(self.session.conversation_items, query)
        except StoreError as e:
            log.info("search failed: %s", e)
            return
        if seq == self._search_seq and not self._closed:
            self.sidebar.set_items(items, self.conv_id)

    def open_conversation(self, conv_id: Optional[int]) -> None:
        hit = self.sidebar.hit_for(conv_id) if conv_id is not None else None
        if conv_id != self.conv_id or conv_id is None:
            self.show_conversation(conv_id)
        if hit is not None:
            self.reveal_message(hit)

    def reveal_message(self, message_id: int) -> None:
        """Scroll to a message and flash it (a search hit); one in another variant or branch is
        made active first."""
        if self.chat_view.widget_for(message_id) is None:
            if self.controller.generating:
                self.status("Stop the current reply before switching variants", 3000)
                return
            self.session.show_variant(message_id)
            self.refresh_messages()
        self.chat_view.reveal(message_id)

    def show_conversation(self, conv_id: Optional[int]) -> None:
        draft = self.drafts.switch(self.conv_id, self.composer.toPlainText(), conv_id)  # issue 19 (ui)
        if draft != self.composer.toPlainText():
            self.composer.setPlainText(draft)
        self.conv_id = conv_id
        self.sidebar.set_current(conv_id)  # also after a restart: the open chat is highlighted
        self.chat_view.selected_id = None
        self._update_title()
        self.refresh_messages()
        self.chat_view.scroll_to_bottom()

    def refresh_messages(self) -> list[MessageVM]:
        vms = self.session.view(self.conv_id) if self.conv_id is not None else []
        self.chat_view.set_messages(vms, context_marker(vms))
        self.draft_counter.schedule()  # issue 19 (ui): the meter counts this path + the draft
        pending = self.controller.pending
        if pending is not None and pending.conversation_id == self.conv_id:
            self.chat_view.stream(pending.reply_id, self.controller.stream_text, 0)
        self.debug_panel.show_reply(self.debug_target(vms))
        self._update_actions()
        return vms

    def budget_requests(self) -> Optional[BudgetRequests]:
        """issue 19 (ui): what the context meter counts: the path shown, the draft, the settings."""
        return budget_requests(self.message_vms(), self.composer.toPlainText(), self.current_settings())

    def debug_target(self, vms: list[MessageVM]) -> Optional[MessageVM]:
        """The selected reply, else the last one: what the debug panel shows and Ctrl+R redoes."""
        sel = self.chat_view.selected_id
        for vm in vms:
            if vm.id == sel and vm.role == "assistant":
                return vm
        return next((vm for vm in reversed(vms) if vm.role == "assistant"), None)

    def _on_message_selected(self, message_id: int) -> None:
        vm = next((vm for vm in self.message_vms() if vm.id == message_id), None)
        if vm is not None and vm.role == "assistant":
            self.debug_panel.show_reply(vm)

    def message_vms(self) -> list[MessageVM]:
        return [w.vm for w in self.chat_view.message_widgets()]

    def show_model_loading(self, spec: str, name: str) -> None:
        self.model_label.setText(f"Loading {name}…")
        self.model_status.setText("loading…")
        self.model_picker.select(spec, name)

    def show_load_progress(self, fraction: float, message: str) -> None:
        if self._closed:
            return
        self.progress.setVisible(True)
        self.progress.setValue(int(fraction * 1000))
        self.model_status.setText(f"{message} {fraction:.0%}")

    def show_model_loaded(self, spec: str, name: str, info: ModelInfo) -> None:
        self.server_toggle.set_model(info, spec)
        self.progress.setVisible(False)
        self.model_status.setText(f"{info.layers} layers · loaded in {info.load_s:.1f} s")
        self.model_label.setText(name)
        self.chat_view.set_assistant_name(name)
        self.qsettings.setValue("model/last", spec)
        self.model_picker.select(spec, name)
        self.draft_counter.schedule()  # issue 19 (ui): the new model's tokenizer and context
        self.status(f"Loaded {name}", 4000)
        log.info("model loaded: %s (%d layers, %.1f s)", name, info.layers, info.load_s)

    def show_model_failed(self, message: str) -> None:
        self.server_toggle.set_model(None)
        self.progress.setVisible(False)
        self.model_status.setText("no model loaded")
        self.model_label.setText("No model")
        self.show_error("Cannot load the model", message)

    def update_memory(self) -> None:
        """The process's resident size (psutil) and, once a job reported it, MLX's active memory."""
        try:
            rss = self._process.memory_info().rss
        except psutil.Error:  # e.g. /proc unreadable in a sandbox
            rss = 0
        text = f"Memory {format_bytes(rss)}" if rss else "Memory –"
        if self.controller.mlx_memory:
            text += f" (MLX {format_bytes(self.controller.mlx_memory)})"
        self.memory_label.setText(text)

    # -------------------------------------------------------------------------- user actions
    def send(self) -> None:
        if self.controller.send(self.composer.toPlainText()):
            self.composer.clear()

    def switch_variant(self, message_id: int) -> None:
        if self.controller.generating:
            self.status("Stop the current reply before switching variants", 3000)
            return
        self.session.show_variant(message_id)
        if self.chat_view.selected_id is not None:
            self.chat_view.selected_id = message_id
        self.refresh_messages()

    def delete_message(self, message_id: int, confirm: bool = True) -> None:
        if self.controller.generating:
            self.status("Stop the current reply first", 3000)
            return
        if confirm and self.session.has_followers(message_id):
            if not dialogs.confirm(self, "Delete message", "Delete this message and everything that follows it?"):
                return
        self.session.delete_message(message_id)
        self.refresh_messages()
        self.refresh_conversations()

    def current_settings(self) -> ChatSettings:
        if self.conv_id is not None:
            try:
                return self.session.settings(self.conv_id)
            except StoreError:
                pass
        return self.default_settings()

    def default_settings(self) -> ChatSettings:
        raw = self.qsettings.value("chat/defaults")
        try:
            return ChatSettings.from_dict(json.loads(raw)) if isinstance(raw, str) else ChatSettings()
        except (ValueError, TypeError):
            return ChatSettings()

    def apply_settings(self, s: ChatSettings, as_default: bool = True) -> None:
        if self.conv_id is not None and not self.read_only:
            self.session.set_settings(self.conv_id, s)
        if as_default or self.conv_id is None:
            self.qsettings.setValue("chat/defaults", json.dumps(s.to_dict()))
        self._update_actions()
        self.draft_counter.schedule()  # issue 19 (ui): the context limit or max tokens may have changed

    def open_settings(self) -> None:
        from app.qt.widgets.settings_dialog import SettingsDialog

        dlg = SettingsDialog(self.current_settings(), self)
        if dlg.exec():
            self.apply_settings(dlg.value(), dlg.as_default.isChecked())

    def focus_search(self) -> None:
        """issue 19 (ui): Ctrl+F: the sidebar's search field, its text selected to type over."""
        self.sidebar.search.setFocus(Qt.FocusReason.ShortcutFocusReason)
        self.sidebar.search.selectAll()

    def new_conversation(self) -> None:
        """An empty chat; the conversation row is created by the first message."""
        self.sidebar.list.clearSelection()
        self.show_conversation(None)
        self.composer.clear()  # issue 19 (ui): a new chat starts empty
        self.refresh_conversations()
        self.composer.setFocus()

    def ask_rename(self, conv_id: int) -> None:
        title = dialogs.ask_title(self, self.session.title(conv_id))
        if title:
            self.rename_conversation(conv_id, title)

    def rename_conversation(self, conv_id: int, title: str) -> None:
        self.session.rename(conv_id, title)
        self.refresh_conversations()

    def delete_conversation(self, conv_id: int, confirm: bool = True) -> None:
        pending = self.controller.pending
        if pending is not None and pending.conversation_id == conv_id:
            self.show_error("Cannot delete", "Stop the reply being generated in this conversation first.")
            return
        if confirm and not dialogs.confirm(
            self, "Delete conversation", f"Delete “{self.session.title(conv_id)}” and all its replies?"
        ):
            return
        self.session.delete_conversation(conv_id)
        self.drafts.forget(conv_id)  # issue 19 (ui)
        if conv_id == self.conv_id:
            self.show_conversation(None)
        self.refresh_conversations()

    def export_conversation(self, conv_id: int) -> None:
        path = dialogs.export_path(self, self.session.title(conv_id))
        if not path:
            return
        try:
            text = self.session.export(conv_id, as_json=path.endswith(".json"), model=self.inspector.model_identity())
            Path(path).write_text(text, encoding="utf-8")
        except (OSError, StoreError) as e:
            self.show_error("Export failed", str(e))
            return
        self.status(f"Exported to {path}", 4000)

    def import_conversation(self) -> None:
        path = dialogs.import_path(self)
        if not path:
            return
        try:
            data = Path(path).read_bytes()
            conv_id = self.session.import_conversation(data)
        except OSError as e:
            self.show_error("Import failed", str(e))
            return
        except StoreError as e:  # issue 19 (ui): a receipt says what it is and how to verify it
            self.show_error("Import failed", import_error_text(path, data, str(e)))
            return
        self.show_conversation(conv_id)
        self.refresh_conversations()

    # ---------------------------------------------------------------------------------- models
    def extra_model_dirs(self) -> list[str]:
        raw = self.qsettings.value("model/dirs", "[]")
        try:
            dirs = json.loads(raw) if isinstance(raw, str) else []
        except ValueError:
            dirs = []
        return [d for d in dirs if isinstance(d, str)]

    def discover_models(self) -> None:
        self._discovery = jobs.spawn(self.model_picker.refresh(self.extra_model_dirs()))

    def open_model_manager(self) -> Any:
        from app.qt.widgets.model_manager import ModelManager

        dlg = ModelManager(self.controller, self.extra_model_dirs(), self.controller.model_spec, self)
        dlg.modelChosen.connect(lambda spec, name: self.controller.load_model(spec, name))
        dlg.dirsChanged.connect(lambda dirs: self.qsettings.setValue("model/dirs", json.dumps(dirs)))
        dlg.finished.connect(lambda _: self.discover_models())
        dlg.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dlg.open()
        return dlg

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
        self._mem_timer.stop()
        self.gc_pacer.stop()
        self.draft_counter.close()  # issue 19 (ui)
        try:
            self._save_geometry()
        except Exception:
            log.exception("cannot save the window geometry")
        if self._discovery is not None:
            self._discovery.cancel()
        self.server_toggle.shutdown()  # its requests' generations stop before the engine thread does
        if self.controller.shutdown():  # a stuck engine thread may still write: leave the store to exit
            self.session.close()
        if self.lock is not None:
            self.lock.release()
