"""The main window: wires the conversation store, the engine worker and the widgets together.

All chat logic lives in `session.ChatSession` (no Qt) and all MLX work on the worker thread;
this class only reacts to user actions and worker signals. The GUI thread never waits on MLX:
the only blocking call is `worker.shutdown()` when the window closes.
"""

from __future__ import annotations

import gc
import json
import logging
import os
from pathlib import Path
from typing import Any, Optional

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
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QInputDialog,
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

from app.core.session import ChatSession, ChatSettings, PendingReply
from app.core.store import ConversationStore, StoreError, open_app_store
from app.core.view_models import MessageVM, format_bytes
from app.qt.gc_pacer import GcPacer
from app.qt.tasks import BackgroundTask
from app.qt.theme import Theme, apply_theme, theme_named
from app.qt.widgets.chat_view import ChatView
from app.qt.widgets.composer import Composer
from app.qt.widgets.debug_panel import DebugPanel
from app.qt.widgets.sidebar import ConversationItem, Sidebar
from app.qt.worker import EngineWorker, Finished

log = logging.getLogger(__name__)

MANAGE = "__manage__"
DEMO_LABEL = "SmolLM2-135M-Instruct (demo)"


def model_label(spec: str) -> str:
    if spec == "demo":
        return DEMO_LABEL
    from engine.models.named import NAMED_MODELS

    if spec in NAMED_MODELS:
        return NAMED_MODELS[spec].label
    p = Path(spec).expanduser()
    if p.exists():
        return p.stem if p.is_file() else p.name
    return spec  # an HF repo id


class MainWindow(QMainWindow):
    def __init__(
        self,
        model: str,
        data_dir: Path,
        chunk: int = 512,
        use_disk: bool = True,
        theme: Optional[str] = None,
        batch_interval: float = 0.05,
    ) -> None:
        super().__init__()
        self.setObjectName("mainWindow")
        self.setWindowTitle("Verbatim")
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Settings live in the data dir, never in the user's global QSettings (tests stay isolated).
        self.qsettings = QSettings(str(self.data_dir / "settings.ini"), QSettings.Format.IniFormat)
        self.store: ConversationStore
        self.store, self.lock = open_app_store(self.data_dir)
        self.read_only = self.lock is None
        self.session = ChatSession(self.store)
        self.worker = EngineWorker(
            None if self.read_only else self.session, self.data_dir / "cache", chunk, use_disk, batch_interval, self
        )
        self.conv_id: Optional[int] = None
        self.pending: Optional[PendingReply] = None
        self.gen_job: Optional[int] = None
        self.stream_text = ""
        self.verify_job: Optional[int] = None
        self.verify_reply: Optional[int] = None
        self.model_spec = model
        self.model_name = model_label(model)
        self.model_ready = False
        self.model_info: Any = None
        self.last_error: Optional[str] = None
        self.last_finished: Optional[Finished] = None
        self.cache_stats: dict[str, Any] = {}
        self.mlx_memory = 0
        self._closed = False
        self._discovery: Optional[BackgroundTask] = None
        self.theme_option = os.environ.get("VERBATIM_THEME") or theme or str(self.qsettings.value("view/theme", "system"))
        self.theme: Theme = theme_named(self.theme_option)

        self._build_ui()
        self._build_menus()
        self._connect_worker()
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
            self._banner(
                "Another Verbatim window is using this data folder: this one is read-only "
                "(you can read conversations, not send)."
            )
        # Garbage collection on this thread, and a full one only between replies (gc_pacer.py).
        self.gc_pacer = GcPacer(busy=lambda: self.generating, parent=self)
        self.gc_pacer.start()
        self.worker.start()
        self.load_model(model, self.model_name)
        self.discover_models()
        self._mem_timer = QTimer(self)
        self._mem_timer.timeout.connect(self._update_memory)
        self._mem_timer.start(2000)
        self._update_memory()
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
        self.model_picker = QComboBox()
        self.model_picker.setObjectName("modelPicker")
        self.model_picker.setMinimumWidth(200)
        self.model_picker.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.model_picker.setMinimumContentsLength(22)
        self.model_picker.setToolTip("The model that answers")
        self.model_picker.activated.connect(self._on_picker)
        tb.addWidget(self.model_picker)
        self.model_status = QLabel("")
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
        self.chat_view.editSubmitted.connect(self.edit_message)
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
        self.regenerate_button.clicked.connect(lambda: self.regenerate(fresh=False))
        self.new_variant_button = QPushButton("⤳ New variant")
        self.new_variant_button.setObjectName("newVariantButton")
        self.new_variant_button.setToolTip("A fresh seed with the current settings (Ctrl+Shift+R)")
        self.new_variant_button.clicked.connect(lambda: self.regenerate(fresh=True))
        actions.addWidget(self.regenerate_button)
        actions.addWidget(self.new_variant_button)
        self.settings_summary = QLabel()
        self.settings_summary.setObjectName("hint")
        self.settings_summary.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.settings_summary.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        actions.addWidget(self.settings_summary, 1)
        bl.addLayout(actions)
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
        self.stop_button.clicked.connect(self.stop)
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
        self.debug_panel.verifyRequested.connect(self.verify_reply_cold)
        self.debug_panel.clearRequested.connect(self.clear_cache)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.debug_panel)
        self.debug_panel.setMinimumWidth(400)
        self.debug_panel.hide()
        self.debug_panel.visibilityChanged.connect(self.debug_button.setChecked)
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
        act(f, "Quit", self.close, QKeySequence.StandardKey.Quit)
        c = mb.addMenu("&Chat")
        self.regenerate_action = act(c, "Regenerate", lambda: self.regenerate(False), "Ctrl+R", "regenerateAction")
        self.variant_action = act(c, "New variant", lambda: self.regenerate(True), "Ctrl+Shift+R", "variantAction")
        self.stop_action = act(c, "Stop", self.stop, "Esc", "stopAction")
        c.addSeparator()
        act(c, "Settings…", self.open_settings, [QKeySequence("Ctrl+,"), QKeySequence(QKeySequence.StandardKey.Preferences)])
        v = mb.addMenu("&View")
        self.debug_action = self.debug_panel.toggleViewAction()
        self.debug_action.setText("Debug panel")
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

    def _connect_worker(self) -> None:
        w = self.worker
        w.loadProgress.connect(self._on_load_progress)
        w.modelLoaded.connect(self._on_model_loaded)
        w.modelFailed.connect(self._on_model_failed)
        w.prefill.connect(self._on_prefill)
        w.tokens.connect(self._on_tokens)
        w.generated.connect(self._on_generated)
        w.generationFailed.connect(self._on_generation_failed)
        w.verified.connect(self._on_verified)
        w.verifyFailed.connect(self._on_verify_failed)
        w.cacheStats.connect(self._on_stats)
        w.memory.connect(self._on_mlx_memory)

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
            self.restoreState(state)
        split = self.qsettings.value("window/splitter")
        if isinstance(split, QByteArray) and not split.isEmpty():
            self.splitter.restoreState(split)

    def _save_geometry(self) -> None:
        self.qsettings.setValue("window/geometry", self.saveGeometry())
        self.qsettings.setValue("window/state", self.saveState())
        self.qsettings.setValue("window/splitter", self.splitter.saveState())
        self.qsettings.sync()

    # ------------------------------------------------------------------------------- messages UI
    @property
    def generating(self) -> bool:
        return self.gen_job is not None

    def _banner(self, text: str) -> None:
        self.banner.setText(text)
        self.banner.setVisible(bool(text))

    def show_error(self, title: str, text: str) -> QMessageBox:
        """A clear message in the window (non-blocking, so nothing waits on the user)."""
        self.last_error = text
        self.statusBar().showMessage(f"{title}: {text}", 10000)
        box = QMessageBox(QMessageBox.Icon.Warning, title, text, QMessageBox.StandardButton.Ok, self)
        box.setObjectName("errorDialog")
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.setWindowModality(Qt.WindowModality.WindowModal)
        box.open()
        return box

    def _update_actions(self) -> None:
        busy = self.generating
        can_write = not self.read_only
        has_conv = self.conv_id is not None
        path_has_user = bool(self.chat_view.order) and any(
            w.vm.role == "user" for w in self.chat_view.message_widgets()
        )
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
                title = f"{self.store.get_conversation(self.conv_id).title} — Verbatim"
            except StoreError:
                pass
        self.setWindowTitle(title)

    def refresh_conversations(self) -> None:
        self._update_title()
        q = self.sidebar.search.text().strip()
        if q:
            items = [ConversationItem(h.conversation.id, h.conversation.title, h.snippet) for h in self.store.search(q)]
        else:
            items = [ConversationItem(c.id, c.title) for c in self.store.list_conversations()]
        self.sidebar.set_items(items, self.conv_id)

    def open_conversation(self, conv_id: Optional[int]) -> None:
        if conv_id == self.conv_id and conv_id is not None:
            return
        self.show_conversation(conv_id)

    def show_conversation(self, conv_id: Optional[int]) -> None:
        self.conv_id = conv_id
        self.chat_view.selected_id = None
        self._update_title()
        self.refresh_messages()
        self.chat_view.scroll_to_bottom()
        self._update_actions()

    def refresh_messages(self) -> list[MessageVM]:
        vms = self.session.view(self.conv_id) if self.conv_id is not None else []
        self.chat_view.set_messages(vms)
        if self.pending is not None and self.pending.conversation_id == self.conv_id:
            self.chat_view.stream(self.pending.reply_id, self.stream_text, 0)
        self._show_debug_for(self._debug_target(vms))
        self._update_actions()
        return vms

    def _debug_target(self, vms: list[MessageVM]) -> Optional[MessageVM]:
        sel = self.chat_view.selected_id
        for vm in vms:
            if vm.id == sel and vm.role == "assistant":
                return vm
        return next((vm for vm in reversed(vms) if vm.role == "assistant"), None)

    def _show_debug_for(self, vm: Optional[MessageVM]) -> None:
        self.debug_panel.show_reply(vm)

    def _on_message_selected(self, message_id: int) -> None:
        vm = next((w.vm for w in self.chat_view.message_widgets() if w.vm.id == message_id), None)
        if vm is not None and vm.role == "assistant":
            self._show_debug_for(vm)

    def message_vms(self) -> list[MessageVM]:
        return [w.vm for w in self.chat_view.message_widgets()]

    # ------------------------------------------------------------------------------ conversations
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

    def set_default_settings(self, s: ChatSettings) -> None:
        self.qsettings.setValue("chat/defaults", json.dumps(s.to_dict()))

    def apply_settings(self, s: ChatSettings, as_default: bool = True) -> None:
        if self.conv_id is not None and not self.read_only:
            self.session.set_settings(self.conv_id, s)
        if as_default or self.conv_id is None:
            self.set_default_settings(s)
        self._update_actions()

    def open_settings(self) -> None:
        from app.qt.widgets.settings_dialog import SettingsDialog

        dlg = SettingsDialog(self.current_settings(), self)
        if dlg.exec():
            self.apply_settings(dlg.value(), dlg.as_default.isChecked())

    def new_conversation(self) -> None:
        """An empty chat; the conversation row is created by the first message."""
        self.sidebar.list.clearSelection()
        self.show_conversation(None)
        self.refresh_conversations()
        self.composer.setFocus()

    def ask_rename(self, conv_id: int) -> None:
        conv = self.store.get_conversation(conv_id)
        title, ok = QInputDialog.getText(self, "Rename conversation", "Title:", text=conv.title)
        if ok and title.strip():
            self.rename_conversation(conv_id, title.strip())

    def rename_conversation(self, conv_id: int, title: str) -> None:
        self.store.rename_conversation(conv_id, title)
        self.refresh_conversations()

    def delete_conversation(self, conv_id: int, confirm: bool = True) -> None:
        if self.pending is not None and self.pending.conversation_id == conv_id:
            self.show_error("Cannot delete", "Stop the reply being generated in this conversation first.")
            return
        if confirm:
            title = self.store.get_conversation(conv_id).title
            answer = QMessageBox.question(self, "Delete conversation", f"Delete “{title}” and all its replies?")
            if answer != QMessageBox.StandardButton.Yes:
                return
        self.store.delete_conversation(conv_id)
        if conv_id == self.conv_id:
            self.show_conversation(None)
        self.refresh_conversations()

    def export_conversation(self, conv_id: int) -> None:
        title = self.store.get_conversation(conv_id).title
        path, flt = QFileDialog.getSaveFileName(
            self, "Export conversation", f"{title}.md", "Markdown (*.md);;Verbatim conversation (*.json)"
        )
        if not path:
            return
        try:
            text = self.store.export_json(conv_id) if path.endswith(".json") else self.store.export_markdown(conv_id)
            Path(path).write_text(text, encoding="utf-8")
        except (OSError, StoreError) as e:
            self.show_error("Export failed", str(e))
            return
        self.statusBar().showMessage(f"Exported to {path}", 4000)

    def import_conversation(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import conversation", "", "Verbatim conversation (*.json)")
        if not path:
            return
        try:
            conv = self.store.import_json(Path(path).read_bytes())
        except (OSError, StoreError) as e:
            self.show_error("Import failed", str(e))
            return
        self.show_conversation(conv.id)
        self.refresh_conversations()

    # ----------------------------------------------------------------------------- chat actions
    def send(self) -> None:
        text = self.composer.toPlainText()
        if not text.strip() or self.generating:
            return
        if self.read_only:
            self.show_error("Read-only", "Another Verbatim window owns this data folder.")
            return
        try:
            if self.conv_id is None:
                self.conv_id = self.session.new_conversation(self.default_settings())
            pending = self.session.begin_send(self.conv_id, text, self.model_name)
        except StoreError as e:
            self.show_error("Cannot save the message", str(e))
            return
        self.composer.clear()
        self._start(pending)

    def regenerate(self, fresh: bool = False) -> None:
        """Regenerate (same seed and settings) or make a new variant (fresh seed) of the selected
        reply, or of the last one; answers a trailing user message that has no reply."""
        if self.generating or self.conv_id is None or self.read_only:
            return
        vms = self.message_vms()
        target = self._debug_target(vms)
        try:
            if vms and vms[-1].role == "user" and (target is None or target.id != self.chat_view.selected_id):
                pending = self.session.begin_reply_to(vms[-1].id, self.model_name)
            elif target is not None:
                pending = self.session.begin_regenerate(target.id, fresh=fresh, model_name=self.model_name)
            else:
                return
        except StoreError as e:
            self.show_error("Cannot regenerate", str(e))
            return
        self._start(pending)

    def edit_message(self, user_id: int, text: str) -> None:
        if self.generating or self.read_only:
            self.statusBar().showMessage("Stop the current reply first", 3000)
            return
        try:
            pending = self.session.begin_edit(user_id, text, self.model_name)
        except StoreError as e:
            self.show_error("Cannot edit", str(e))
            return
        self._start(pending)

    def switch_variant(self, message_id: int) -> None:
        if self.generating:
            self.statusBar().showMessage("Stop the current reply before switching variants", 3000)
            return
        self.store.set_active(message_id)
        if self.chat_view.selected_id is not None:
            self.chat_view.selected_id = message_id
        self.refresh_messages()

    def delete_message(self, message_id: int, confirm: bool = True) -> None:
        if self.generating:
            self.statusBar().showMessage("Stop the current reply first", 3000)
            return
        if confirm:
            below = self.store.children(message_id)
            if below:
                answer = QMessageBox.question(
                    self, "Delete message", "Delete this message and everything that follows it?"
                )
                if answer != QMessageBox.StandardButton.Yes:
                    return
        self.store.delete_message(message_id)
        self.refresh_messages()
        self.refresh_conversations()

    def stop(self) -> None:
        if self.gen_job is not None:
            self.worker.cancel(self.gen_job)
            self.statusBar().showMessage("Stopping…", 2000)

    def _start(self, pending: PendingReply) -> None:
        self.pending = pending
        self.stream_text = ""
        self.chat_view.selected_id = pending.reply_id
        self.gen_job = self.worker.generate(pending)
        self.refresh_conversations()
        self.refresh_messages()
        self.chat_view.scroll_to_bottom()
        verb = {"regenerate": "Regenerating", "variant": "New variant"}.get(pending.action, "Generating")
        self.statusBar().showMessage(f"{verb}… (seed {pending.request.sampler.seed})")

    # ----------------------------------------------------------------------------- worker signals
    def _on_prefill(self, job: int, done: int, total: int) -> None:
        if job != self.gen_job or self.pending is None or self._closed:
            return
        self.chat_view.prefill(self.pending.reply_id, done, total)
        self.statusBar().showMessage(f"Reading the prompt: {done} / {total} tokens")

    def _on_tokens(self, job: int, text: str, count: int) -> None:
        if job != self.gen_job or self.pending is None or self._closed:
            return
        self.stream_text += text
        self.chat_view.stream(self.pending.reply_id, self.stream_text, count)
        self.statusBar().showMessage(f"Generating… {count} tokens")

    def _end_generation(self) -> Optional[PendingReply]:
        pending = self.pending
        if pending is not None:
            self.chat_view.end_stream(pending.reply_id)
        self.pending = None
        self.gen_job = None
        self.stream_text = ""
        return pending

    def _on_generated(self, job: int, finished: Finished) -> None:
        if job != self.gen_job or self._closed:
            return
        self._end_generation()
        self.last_finished = finished
        self.refresh_messages()  # the sidebar was refreshed when the reply started
        r = finished.result
        rep = r.report
        msg = f"{len(r.tokens)} tokens · restored {rep.restored} / {rep.prompt_tokens}"
        ident = (finished.message.cache_report or {}).get("identical") if finished.message is not None else None
        if r.finish_reason == "cancelled":
            msg = "Stopped · " + msg
        elif ident is True:
            msg += " · identical to previous"
        elif ident is False:
            msg += " · differs from previous"
        self.statusBar().showMessage(msg, 8000)
        if rep.warnings:  # the engine hands each disk problem over once; keep it in view
            self._banner("Prompt cache: " + "; ".join(rep.warnings)
                         + " Replies still work; the cache is kept in memory only.")

    def _on_generation_failed(self, job: int, message: str) -> None:
        if job != self.gen_job or self._closed:
            return
        self._end_generation()
        self.refresh_messages()
        self.show_error("The reply could not be generated", message)

    def _on_load_progress(self, fraction: float, message: str) -> None:
        if self._closed:
            return
        self.progress.setVisible(True)
        self.progress.setValue(int(fraction * 1000))
        self.model_status.setText(f"{message} {fraction:.0%}")

    def _on_model_loaded(self, info: Any) -> None:
        if self._closed:
            return
        self.model_ready = True
        self.model_info = info
        # Move everything alive now (Qt, MLX, transformers: ~100k objects) out of the cyclic GC's
        # reach, so the full collections the GC pacer runs between replies stay short. New
        # objects are still collected normally. Collect first (once, ~50 ms, nothing is streaming)
        # so the loader's garbage cycles are freed rather than frozen for the life of the process.
        gc.collect()
        gc.freeze()
        self.progress.setVisible(False)
        self.model_status.setText(f"{info.layers} layers · loaded in {info.load_s:.1f} s")
        self.model_label.setText(self.model_name)
        self.chat_view.set_assistant_name(self.model_name)
        self.qsettings.setValue("model/last", self.model_spec)
        self._select_picker(self.model_spec, self.model_name)
        self.statusBar().showMessage(f"Loaded {self.model_name}", 4000)

    def _on_model_failed(self, spec: str, message: str) -> None:
        if self._closed:
            return
        self.model_ready = False
        self.model_info = None
        self.progress.setVisible(False)
        self.model_status.setText("no model loaded")
        self.model_label.setText("No model")
        self.show_error("Cannot load the model", message)

    def _on_stats(self, stats: dict[str, Any]) -> None:
        if self._closed:
            return
        self.cache_stats = stats
        self.debug_panel.show_stats(stats)

    def _on_mlx_memory(self, nbytes: int) -> None:
        self.mlx_memory = nbytes
        self._update_memory()

    def _update_memory(self) -> None:
        try:
            import psutil

            rss = psutil.Process().memory_info().rss
            text = f"Memory {format_bytes(rss)}"
        except Exception:  # psutil is optional
            text = "Memory –"
        if self.mlx_memory:
            text += f" (MLX {format_bytes(self.mlx_memory)})"
        self.memory_label.setText(text)

    # ------------------------------------------------------------------------------ debug panel
    def verify_reply_cold(self, reply_id: int) -> None:
        try:
            request, tokens, logprobs = self.session.verify_inputs(reply_id)
        except StoreError as e:
            self.debug_panel.show_verify(reply_id, str(e))
            return
        self.verify_reply = reply_id
        self.verify_job = self.worker.verify(request, tokens, logprobs)
        self.debug_panel.set_verifying(True)

    def _on_verified(self, job: int, cmp: Any) -> None:
        if job != self.verify_job or self._closed:
            return
        self.verify_job = None
        self.debug_panel.set_verifying(False)
        text = ("✓ " if cmp.identical else "≠ ") + cmp.detail
        if self.verify_reply is not None:
            self.debug_panel.show_verify(self.verify_reply, text)

    def _on_verify_failed(self, job: int, message: str) -> None:
        if job != self.verify_job or self._closed:
            return
        self.verify_job = None
        self.debug_panel.set_verifying(False)
        if self.verify_reply is not None:
            self.debug_panel.show_verify(self.verify_reply, f"failed: {message}")

    def clear_cache(self) -> None:
        self.worker.clear_cache()
        self.statusBar().showMessage("Prompt cache cleared", 3000)

    # ---------------------------------------------------------------------------------- models
    def load_model(self, spec: str, name: Optional[str] = None) -> None:
        if self.gen_job is not None:
            self.worker.cancel(self.gen_job)
        self.model_spec = spec
        self.model_name = name or model_label(spec)
        self.model_ready = False
        self.model_label.setText(f"Loading {self.model_name}…")
        self.model_status.setText("loading…")
        self._select_picker(spec, self.model_name)
        self.worker.load(spec)

    def _select_picker(self, spec: str, name: str) -> None:
        p = self.model_picker
        i = p.findData(spec)
        if i < 0:
            i = max(p.findData(MANAGE), 0)
            p.insertItem(i, name, spec)
        p.setCurrentIndex(i)
        if p.findData(MANAGE) < 0:
            p.insertSeparator(p.count())
            p.addItem("Manage models…", MANAGE)

    def _on_picker(self, index: int) -> None:
        spec = self.model_picker.itemData(index)
        if spec == MANAGE:
            self._select_picker(self.model_spec, self.model_name)
            self.open_model_manager()
        elif spec and spec != self.model_spec:
            self.load_model(spec, self.model_picker.itemText(index))

    def extra_model_dirs(self) -> list[str]:
        raw = self.qsettings.value("model/dirs", "[]")
        try:
            dirs = json.loads(raw) if isinstance(raw, str) else []
        except ValueError:
            dirs = []
        return [d for d in dirs if isinstance(d, str)]

    def discover_models(self) -> None:
        """Fill the picker from engine.models.discover_models (a background thread: it reads files)."""
        from app.qt.widgets.model_manager import discover, entry_spec

        dirs = self.extra_model_dirs()

        def found(entries: list[Any]) -> None:
            if self._closed:
                return
            for e in entries:
                spec = entry_spec(e)
                if self.model_picker.findData(spec) < 0:
                    name = DEMO_LABEL if e.source == "demo" else e.name
                    self.model_picker.insertItem(max(self.model_picker.findData(MANAGE) - 1, 0), name, spec)
            self._select_picker(self.model_spec, self.model_name)

        task = BackgroundTask(lambda: discover(dirs), with_progress=False, parent=self)
        task.done.connect(found)
        task.failed.connect(lambda msg: log.info("model discovery failed: %s", msg))
        self._discovery = task.start()

    def open_model_manager(self) -> Any:
        from app.qt.widgets.model_manager import ModelManager

        dlg = ModelManager(self.worker, self.extra_model_dirs(), self.model_spec, self)
        dlg.modelChosen.connect(self.load_model)
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
        """Stop generating (the worker saves the partial reply as interrupted), stop the engine
        thread, close the store and release the data dir."""
        if self._closed:
            return
        self._closed = True
        self._mem_timer.stop()
        self.gc_pacer.stop()
        try:
            self._save_geometry()
        except Exception:
            log.exception("cannot save the window geometry")
        ended = self.worker.shutdown(timeout=30.0)
        if self._discovery is not None:
            self._discovery.cancel()
        if ended:  # a stuck worker may still write: leave the store to process exit then
            self.store.close()
        if self.lock is not None:
            self.lock.release()
