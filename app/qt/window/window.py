"""The main window: layout, menus, and the wiring from the chat model's events to the widgets.

The chat's state lives in `ChatModel` (app/core/chat.py, Qt-free): the window sends it intents
(send, regenerate, select a reply...) through the operations there and in app/core/engine_link/flows.py,
and shows what it emits (`_wire`); it never reads state back from a widget. The conversation
actions (rename, delete, export, import) are in app/qt/conversation/actions.py, dialogs in
app/qt/dialogs.py, model discovery in the model picker.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from PySide6.QtCore import QSettings, Qt, QTimer
from PySide6.QtGui import QCloseEvent, QGuiApplication
from PySide6.QtWidgets import (
    QApplication,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QPushButton,
    QSizePolicy,
    QSplitter,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core import ops
from app.core.engine_link import flows
from app.core.engine_link.cache_move import move_prompt_cache
from app.core.chat import ChatModel
from app.core.engine_link.models import model_label
from app.core.generation.replay import REGENERATE_TIP
from app.core.session import ChatSession, ChatSettings
from app.core.store import ConversationStore, StoreError, open_app_store
from app.core.composer.drafts import Drafts
from app.core.conversation.view_models import MessageVM, context_marker, settings_summary
from app.qt import dialogs, jobs
from app.qt.conversation import actions as conversation_actions
from app.qt.window import menus
from app.qt.engine_link import model_actions
from app.qt.conversation import runs_memory
from app.qt.composer.attach import AttachControls
from app.qt.window.dock_width import DockWidth
from app.qt.window.gc_pacer import GcPacer
from app.qt.inspector.inspector import Inspector
from app.qt.theme import Theme, apply_theme, theme_named
from app.qt.conversation.chat_view import ChatView
from app.qt.composer.composer import Composer
from app.qt.composer.context_meter import ContextMeter
from app.qt.inspector.debug_panel import DebugPanel
from app.qt.widgets.elided_label import ElidedLabel
from app.qt.engine_link.model_picker import ModelPicker
from app.qt.widgets.notice import Notice
from app.qt.conversation.sidebar import Sidebar
from app.qt.window.state import restore_window_state, save_window_state
from engine.engine import Engine
from engine.executor import EngineExecutor

log = logging.getLogger(__name__)
SHUTDOWN_S = 30.0  # how long closing the window waits for the engine thread
DRAFT_SAVE_MS = 1000  # the draft is written to the store once typing pauses this long


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
        model_actions.move_key_to_keyring(self)  # a server key an older version left in settings.ini
        self.session = ChatSession(store)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else self.data_dir / "cache"
        if self.cache_dir != self.data_dir / "cache" and not self.read_only:  # the lock holder moves it
            move_prompt_cache(self.data_dir / "cache", self.cache_dir)
        cache_dir_ = self.cache_dir

        def make_engine() -> Engine:  # on the engine thread: at start, and after a server is left
            return Engine(cache_dir=cache_dir_, use_disk=use_disk, chunk=chunk, context_length=context_length)

        self.chat = ChatModel(self.session, EngineExecutor(make_engine), jobs.gui_loop(), jobs.spawn,
                              self.default_settings, chunk, batch_interval, self.read_only)
        last_local = self.qsettings.value("model/last_local")
        self.chat.use_engines(make_engine, last_local if isinstance(last_local, str) and last_local else "demo")
        self.engine_closed = False  # the engine thread ended in time when the window closed
        self._streaming_id: Optional[int] = None  # the reply the chat view streams into
        self._closed = False
        self._search_seq = 0
        self._search_job: Optional[Any] = None
        self._discovery: Optional[Any] = None
        self.drafts = Drafts(store, writable=not self.read_only)  # each conversation's unsent text, kept
        self.theme_option = os.environ.get("VERBATIM_THEME") or theme or str(self.qsettings.value("view/theme", "system"))
        self.theme: Theme = theme_named(self.theme_option)

        self.chat.remember_runs(runs_memory.picked_runs(self.qsettings))  # the runs picked before the last quit
        self._build_ui()
        self.inspector = Inspector(self)  # compare view, per-token view, receipts (app/qt/inspector/inspector.py)
        menus.build_menus(self)
        self._wire()
        self._apply_theme()
        QGuiApplication.styleHints().colorSchemeChanged.connect(lambda _: self._apply_theme())
        restore_window_state(self)
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
        self.gc_pacer = GcPacer(busy=lambda: self.chat.generating, parent=self)
        self.gc_pacer.start()
        self.load_model(model)
        self.discover_models()
        self._mem_timer = model_actions.memory_timer(self)
        self._update_actions()

    # ------------------------------------------------------------------------------------ UI
    def _build_ui(self) -> None:
        self.sidebar = Sidebar()
        self.sidebar.selected.connect(self.open_conversation)
        self.sidebar.newRequested.connect(self.new_conversation)
        self.sidebar.renameRequested.connect(self.ask_rename)
        self.sidebar.deleteRequested.connect(lambda cid: self.delete_conversation(cid, confirm=True))
        self.sidebar.exportRequested.connect(self.export_conversation)
        self.sidebar.searchChanged.connect(lambda _: (self.chat_view.clear_mark(), self.refresh_conversations()))

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
        self.model_picker.chosen.connect(self.load_model)
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
        self.chat_view.selected.connect(lambda mid: self.chat.select(mid))
        self.chat_view.runChosen.connect(lambda mid, k: self.chat.show_run(mid, k))
        self.chat_view.navigate.connect(lambda mid: ops.switch_variant(self.chat, mid))
        self.chat_view.editSubmitted.connect(lambda mid, text: ops.edit(self.chat, mid, text))
        self.chat_view.deleteRequested.connect(lambda mid: self.delete_message(mid, confirm=True))
        self.chat_view.continueRequested.connect(lambda mid: ops.continue_reply(self.chat, mid))
        self.chat_view.regenerateRequested.connect(self.regenerate_reply)
        self.chat_view.copied.connect(lambda msg: self.statusBar().showMessage(msg, 2000))
        col.addWidget(self.chat_view, 1)

        bottom = QWidget()
        bottom.setObjectName("composerArea")
        bl = QVBoxLayout(bottom)
        bl.setContentsMargins(16, 8, 16, 12)
        bl.setSpacing(6)
        self.notice = Notice()  # an explanation, whole and wrapped, until the next reply (NOTICE)
        bl.addWidget(self.notice)
        actions = QHBoxLayout()
        self.regenerate_button = QPushButton("↻ Regenerate")
        self.regenerate_button.setObjectName("regenerateButton")
        self.regenerate_button.setToolTip(REGENERATE_TIP)
        self.regenerate_button.clicked.connect(lambda: ops.regenerate(self.chat, fresh=False))
        self.new_variant_button = QPushButton("⤳ New variant")
        self.new_variant_button.setObjectName("newVariantButton")
        self.new_variant_button.setToolTip("A fresh seed with the current settings (Ctrl+Shift+R)")
        self.new_variant_button.clicked.connect(lambda: ops.regenerate(self.chat, fresh=True))
        actions.addWidget(self.regenerate_button)
        actions.addWidget(self.new_variant_button)
        actions.addStretch(1)
        self.context_meter = ContextMeter()  # right above the composer, in line with Send
        actions.addWidget(self.context_meter)
        bl.addLayout(actions)
        # What Regenerate and New variant use, on a line of its own: beside the buttons a narrow
        # window (a small screen, the debug dock open) squeezed it to nothing.
        self.settings_summary = ElidedLabel()
        self.settings_summary.setObjectName("hint")
        self.settings_summary.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        bl.addWidget(self.settings_summary)
        bl.addWidget(self.context_meter.warning)  # what Send will do when the next prompt does not fit
        self.attach = AttachControls(self)  # the attach (paperclip) button, drops, the chips (app/qt/composer/attach.py)
        bl.addWidget(self.attach.bar)
        row = QHBoxLayout()
        row.addWidget(self.attach.button, 0, Qt.AlignmentFlag.AlignTop)
        self.composer = Composer()
        self.composer.submitted.connect(self.send)
        self.composer.textChanged.connect(self._draft_changed)
        self._draft_timer = QTimer(self)  # the draft is saved once typing pauses (and at close)
        self._draft_timer.setSingleShot(True)
        self._draft_timer.setInterval(DRAFT_SAVE_MS)
        self._draft_timer.timeout.connect(self.save_draft)
        row.addWidget(self.composer, 1)
        buttons = QVBoxLayout()
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("sendButton")
        self.send_button.setToolTip("Send (Enter)")
        self.send_button.clicked.connect(self.send)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setObjectName("stopButton")
        self.stop_button.setToolTip("Stop the reply (Esc)")
        self.stop_button.clicked.connect(lambda: ops.stop(self.chat))
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
        self.debug_panel.verifyRequested.connect(lambda rid: flows.verify(self.chat, rid))
        self.debug_panel.clearRequested.connect(lambda: flows.clear_cache(self.chat))
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.debug_panel)
        self.debug_panel.hide()
        self.dock_width = DockWidth(self, self.debug_panel, self._dock_room)  # app/qt/window/dock_width.py
        self.debug_panel.visibilityChanged.connect(self.debug_button.setChecked)
        self.debug_button.toggled.connect(self.debug_panel.setVisible)

        self.progress, self.model_label, self.memory_label = model_actions.status_widgets(self.statusBar())
        self.setMinimumSize(*self.MIN_SIZE)  # what the layout checks (tests/gui/xcb_window_checks.py) cover
        self.resize(1200, 800)

    MIN_SIZE = (800, 600)

    def _dock_room(self) -> int:
        return self.width() - self.sidebar.width() - self.splitter.widget(1).minimumSizeHint().width() - 16

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

    # ------------------------------------------------------------------- the chat model's events
    def _wire(self) -> None:
        """What the window shows of each change the chat model tells (app/core/chat.py)."""
        c = self.chat
        c.subscribe(ops.PATH, self._show_path)
        c.subscribe(ops.SELECTED, self._show_selected)
        c.subscribe(ops.PENDING, self._show_pending)
        c.subscribe(ops.STREAM, lambda rid, text, n: (self.chat_view.stream(rid, text, n),
                                                      self.status(f"Generating… {n} tokens")))
        c.subscribe(ops.PREFILL, self._show_prefill)
        c.subscribe(ops.REPLAY, lambda rid, replay: (self.chat_view.replay(rid, replay), self.status(replay.badge)))
        c.subscribe(ops.DRAFT, lambda budget: (self.context_meter.show_budget(budget), self._update_actions()))
        c.subscribe(ops.RETURNED, lambda text: self.composer.toPlainText() or self.composer.setPlainText(text))
        c.subscribe(ops.STATUS, self.status)
        c.subscribe(ops.ERROR, self._show_error)
        c.subscribe(ops.BANNER, self.banner_text)
        c.subscribe(ops.NOTICE, self.notice.show_text)
        c.subscribe(ops.RUNS, lambda runs: self.read_only or runs_memory.keep_picked_runs(self.qsettings, runs))
        c.subscribe(ops.CONVERSATIONS, self.refresh_conversations)
        c.subscribe(ops.STATS, lambda stats, memory: (self.debug_panel.show_stats(stats), self.update_memory()))
        c.subscribe(flows.MODEL, lambda what, *args: model_actions.show_model(self, what, *args))
        c.subscribe(ops.LINK, lambda link: model_actions.show_link(self, link))
        c.subscribe(flows.VERIFY, self._show_verify)
        self.attach.wire()
        self.attach.watch(self.composer, self.chat_view.viewport())

    @property
    def conv_id(self) -> Optional[int]:
        return self.chat.conv_id

    def _vm(self, message_id: Optional[int]) -> Optional[MessageVM]:
        return next((vm for vm in self.chat.vms if vm.id == message_id), None)

    def _show_path(self, vms: list[MessageVM]) -> None:
        self.chat_view.set_messages(vms, context_marker(vms))
        pending = self.chat.pending
        if pending is not None and pending.conversation_id == self.conv_id:
            self.chat_view.stream(pending.reply_id, self.chat.stream.text, self.chat.stream.tokens)
        self._update_title()
        self._update_actions()

    def _show_selected(self, vm: Optional[MessageVM]) -> None:
        self.chat_view.show_selected(vm.id if vm is not None else None)
        self.debug_panel.show_reply(vm)
        self._update_actions()

    def _show_pending(self, pending: Any) -> None:
        if pending is None and self._streaming_id is not None:
            self.chat_view.end_stream(self._streaming_id)
        self._streaming_id = pending.reply_id if pending is not None else None
        if pending is not None:
            self.chat_view.scroll_to_bottom()
        self._update_actions()

    def _show_prefill(self, reply_id: int, done: int, total: int) -> None:
        line = self.chat_view.prefill(reply_id, done, total)  # with its rate and time left
        self.status(line or f"Reading the prompt: {done:,} / {total:,}")

    def _show_verify(self, reply_id: int, text: Optional[str]) -> None:
        self.debug_panel.set_verifying(text is None)  # None: the cold run is under way
        if text is not None:
            self.debug_panel.show_verify(reply_id, text)

    # ------------------------------------------------------------------------- what is shown
    def status(self, text: str, ms: int = 0) -> None:
        self.statusBar().showMessage(text, ms)

    def banner_text(self, text: str) -> None:
        self.banner.setText(text)
        self.banner.setVisible(bool(text))

    def show_error(self, title: str, text: str) -> None:
        """Tell the user (through the chat model, so every error is one event)."""
        self.chat.emit(ops.ERROR, title, text)

    def _show_error(self, title: str, text: str) -> None:
        if self._closed:
            return
        self.status(f"{title}: {text}", 10000)
        dialogs.error_box(self, title, text)

    def _update_actions(self) -> None:
        busy = self.chat.generating
        link = self.chat.link
        can_write = not self.read_only and (link is None or link.up)  # a server gone: Send waits
        has_conv = self.conv_id is not None
        path_has_user = any(vm.role == "user" for vm in self.chat.vms)
        self._update_send()
        self.stop_button.setEnabled(busy)
        self.stop_action.setEnabled(True)  # Esc must always reach stop(); it ignores idle presses
        for b in (self.regenerate_button, self.new_variant_button, self.regenerate_action, self.variant_action):
            b.setEnabled(can_write and not busy and has_conv and path_has_user)
        self.composer.setReadOnly(self.read_only)
        self.settings_summary.setText(settings_summary(self.current_settings(), self.chat.selected))
        self.settings_summary.setToolTip(self.chat.selected.settings_note if self.chat.selected else "")

    def _update_send(self) -> None:
        """Send waits (disabled, the reason its tooltip) while the meter says it would be refused
        or the server is away; the composer stays editable: what is typed is kept."""
        link = self.chat.link
        why = self.chat.refusal(self.composer.toPlainText())
        if link is not None and not link.up:
            why = f"The server is not reachable ({link.error or 'no answer'}): Send works again when it answers"
        self.send_button.setEnabled(not self.read_only and not self.chat.generating and not why)
        self.send_button.setToolTip(why or "Send (Enter)")

    def _draft_changed(self) -> None:
        self.chat_view.clear_mark()  # typing: the next action after a search
        self.chat.set_draft(self.composer.toPlainText())
        self._update_send()
        self._draft_timer.start()

    def save_draft(self) -> None:
        """The composer's text as the open conversation's draft, in the store."""
        self._draft_timer.stop()
        self.drafts.keep(self.conv_id, self.composer.toPlainText())

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
        and only the latest one's results are shown. Not once the window closed (the store is)."""
        if self._closed:
            return
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
        """Scroll to a message and mark it and the search's words in it (a search hit), until
        the next action; one in another variant or branch is made active first."""
        if self._vm(message_id) is None and not ops.switch_variant(self.chat, message_id):
            return
        self.chat_view.reveal(message_id, self.sidebar.terms())

    def show_conversation(self, conv_id: Optional[int]) -> None:
        draft = self.drafts.switch(self.conv_id, self.composer.toPlainText(), conv_id)  # each chat keeps its draft
        if draft != self.composer.toPlainText():
            self.composer.setPlainText(draft)
        self.sidebar.set_current(conv_id)  # also after a restart: the open chat is highlighted
        self.chat.open(conv_id)
        self.chat_view.scroll_to_bottom()

    def update_memory(self) -> None:
        model_actions.update_memory(self)

    # -------------------------------------------------------------------------- user actions
    def send(self) -> None:
        was = self.conv_id
        if ops.send(self.chat, self.composer.toPlainText()):
            self.drafts.forget(was)  # sent: no longer a draft (the new chat's too)
            self.composer.clear()
            self.attach.sent()

    def regenerate_reply(self, reply_id: int) -> None:
        """A reply's own ↻: that reply selected and regenerated (as Regenerate does the selected one)."""
        self.chat.select(reply_id)
        ops.regenerate(self.chat, fresh=False)

    def delete_message(self, message_id: int, confirm: bool = True) -> None:
        if self.chat.generating:
            self.status("Stop the current reply first", 3000)
            return
        if confirm and self.session.has_followers(message_id):
            if not dialogs.confirm(self, "Delete message", "Delete this message and everything that follows it?"):
                return
        ops.delete_message(self.chat, message_id)

    def current_settings(self) -> ChatSettings:
        return self.chat.settings()

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
            # A context limit is the conversation's own: new chats start with the model's context.
            default = s if self.conv_id is None else replace(s, context_length=0)
            self.qsettings.setValue("chat/defaults", json.dumps(default.to_dict()))
        self._update_actions()
        self.chat.recount()  # the context limit or max tokens may have changed

    def open_settings(self) -> None:
        from app.qt.conversation.settings_dialog import SettingsDialog

        dlg = SettingsDialog(self.current_settings(), self, self.chat.template_system)
        try:
            if dlg.exec():
                self.apply_settings(dlg.value(), dlg.as_default.isChecked())
        finally:
            dlg.deleteLater()  # a child of the window: it would stay until the window goes (soak test)

    def focus_search(self) -> None:
        """Ctrl+F: the sidebar's search field, its text selected to type over."""
        self.sidebar.search.setFocus(Qt.FocusReason.ShortcutFocusReason)
        self.sidebar.search.selectAll()

    def new_conversation(self) -> None:
        """An empty chat; the conversation row is created by the first message."""
        self.sidebar.list.clearSelection()
        self.show_conversation(None)
        self.composer.clear()  # a new chat starts empty
        self.refresh_conversations()
        self.composer.setFocus()

    # Whole conversations: app/qt/conversation/actions.py.
    def ask_rename(self, conv_id: int) -> None:
        conversation_actions.ask_rename(self, conv_id)

    def rename_conversation(self, conv_id: int, title: str) -> None:
        conversation_actions.rename(self, conv_id, title)

    def delete_conversation(self, conv_id: int, confirm: bool = True) -> None:
        conversation_actions.delete(self, conv_id, confirm)

    def export_conversation(self, conv_id: int) -> None:
        conversation_actions.export(self, conv_id)

    def import_conversation(self) -> None:
        conversation_actions.import_(self)

    # ---------------------------------------------------------------------------------- models
    def load_model(self, spec: str, name: Optional[str] = None) -> None:
        """Load a model, or attach to a Verbatim server (an http:// spec, with its remembered key)."""
        flows.load_model(self.chat, spec, name or model_label(spec), api_key=model_actions.server_key(self, spec))

    def discover_models(self) -> None:
        self._discovery = jobs.spawn(self.model_picker.refresh(model_actions.extra_model_dirs(self.qsettings)))

    def open_model_manager(self) -> Any:
        return model_actions.open_model_manager(self)

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
        self.sidebar.stop()  # a search typed just before closing must not reach the closed store
        self.save_draft()  # what was typed and not sent is there at the next start
        try:
            save_window_state(self)
        except Exception:
            log.exception("cannot save the window geometry")
        if self._discovery is not None:
            self._discovery.cancel()
        self.server_toggle.shutdown()  # its requests' generations stop before the engine thread does
        self.engine_closed = self.chat.shutdown(SHUTDOWN_S)
        if self.engine_closed:  # a stuck engine thread may still write: leave the store to exit
            self.session.close()
        if self.lock is not None:
            self.lock.release()

