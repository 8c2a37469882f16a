"""The chat controller: generation state, and every flow that waits on the engine, as coroutines.

The window (layout and menus) forwards user actions here. One reply, top to bottom:

    Send / Enter / Ctrl+R      ChatController.send / regenerate / edit       GUI thread: the
                               -> session.begin_*                            user's message and a
                                                                             placeholder are saved
                               -> reply(pending), a coroutine:
                                    await on_engine(ReplyJob)                engine thread:
                                      engine.generate, text to _show_text    (Relay: batched),
                                      partial saves, session.finish          the reply is saved
                               -> session.view -> view models -> chat view, debug panel, status

The job saves the reply itself (session.finish on the engine thread; the store is thread-safe),
so a reply is saved even when the window closes mid-reply: `shutdown` cancels the request's
CancelToken and waits (bounded) for the engine thread; it needs no further turn of the loop.
Model loading, verify and cache clearing follow the same shape: start (sync), await a job on
the engine thread, show the outcome. Coroutines resume on the GUI thread (app/qt/jobs.py).

Just over ~400 lines: every flow that waits on the engine (reply, load, verify, clear, stats,
shutdown) shares the same cancel tokens and generation state, which is why they live together.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Protocol

from PySide6.QtCore import QObject, Signal

from app.core.models import model_label
from app.core.session import ChatSession, PendingReply
from app.core.store import Message, StoreError
from app.core.view_models import (
    finished_text,
    identity_text,
    progress_text,
    verify_text,
)
from app.qt import jobs
from app.qt.jobs import Relay
from engine.engine import Engine, ModelInfo
from engine.executor import EngineExecutor
from engine.generate.loop import drain
from engine.types import (
    CacheReport,
    CancelToken,
    GenerationResult,
    PrefillProgress,
    TokenEvent,
)

if TYPE_CHECKING:
    from app.core.session import ChatSettings
    from app.core.view_models import MessageVM
    from app.qt.widgets.chat_view import ChatView
    from app.qt.widgets.debug_panel import DebugPanel

log = logging.getLogger(__name__)
PARTIAL_SAVE_S = 5.0  # how often a long reply's streamed text is written to the store
SHUTDOWN_S = 30.0  # how long closing the window waits for the engine thread


@dataclass
class Finished:
    """A generation that ran to its end (stop, length or cancel), already saved."""

    pending: PendingReply
    result: GenerationResult
    message: Message  # as saved
    stats: dict[str, Any]  # Engine.cache_stats() after it
    memory: int  # MLX active memory after it


class ChatWindow(Protocol):
    """What the controller shows its results on (app/qt/window.py's MainWindow)."""

    conv_id: Optional[int]
    chat_view: "ChatView"
    debug_panel: "DebugPanel"

    def status(self, text: str, ms: int = 0) -> None: ...
    def show_error(self, title: str, text: str) -> Any: ...
    def banner_text(self, text: str) -> None: ...
    def refresh_messages(self) -> Any: ...
    def refresh_conversations(self) -> None: ...
    def message_vms(self) -> list["MessageVM"]: ...
    def debug_target(self, vms: list["MessageVM"]) -> Optional["MessageVM"]: ...
    def default_settings(self) -> "ChatSettings": ...
    def show_model_loading(self, spec: str, name: str) -> None: ...
    def show_load_progress(self, fraction: float, message: str) -> None: ...
    def show_model_loaded(self, spec: str, name: str, info: ModelInfo) -> None: ...
    def show_model_failed(self, message: str) -> None: ...
    def update_memory(self) -> None: ...


def mlx_memory() -> int:
    """MLX active memory in bytes (engine thread), 0 if unknown."""
    try:
        import mlx.core as mx

        return int(mx.get_active_memory())
    except Exception:
        return 0


class ReplyJob:
    """One reply on the engine thread: generate, hand the text to the GUI in batches (the first
    text at once, then at most one update per `text.interval`), save the text every
    PARTIAL_SAVE_S, then save the reply (or keep what streamed when generation raises)."""

    def __init__(self, session: ChatSession, pending: PendingReply, text: Relay, prefill: Relay, cancel: CancelToken):
        self.session, self.pending, self.text, self.prefill, self.cancel = session, pending, text, prefill, cancel
        self.pieces: list[str] = []
        self.sent = 0  # characters handed to the GUI so far
        self.count = 0
        self.saved = time.perf_counter()

    def forward(self, ev: Any) -> None:
        """One event of the generation stream, on its way to the GUI (batched) and the store."""
        if isinstance(ev, TokenEvent):
            self.pieces.append(ev.text)
            self.count = ev.index + 1
            if ev.text and self.text("".join(self.pieces), self.count, force=self.sent == 0):
                self.sent = sum(map(len, self.pieces))
            now = time.perf_counter()
            if now - self.saved >= PARTIAL_SAVE_S:
                self.saved = now
                self.session.save_partial(self.pending, "".join(self.pieces))
        elif isinstance(ev, PrefillProgress):
            self.prefill(ev.done, ev.total, force=ev.done in (0, ev.total))

    def __call__(self, engine: Engine) -> Finished:
        try:
            # Stop is the request's CancelToken: the stream then ends with what it has, which is
            # saved as an interrupted reply (closing it would return nothing to save).
            result = drain(engine.stream(self.pending.request, cancel=self.cancel), self.forward)
        except Exception:
            self.session.fail(self.pending, "".join(self.pieces))
            raise
        if sum(map(len, self.pieces)) > self.sent:  # the last batch
            self.text("".join(self.pieces), self.count, force=True)
        message = self.session.finish(self.pending, result)
        return Finished(self.pending, result, message, engine.cache_stats(), mlx_memory())


class ChatController(QObject):
    streamed = Signal(str, int)  # after the view shows it: the reply's text so far, tokens so far
    prefilled = Signal(int, int)  # prompt tokens in the cache so far, prompt tokens in all

    def __init__(self, window: ChatWindow, session: ChatSession, cache_dir: Path, chunk: int = 512,
                 use_disk: bool = True, batch_interval: float = 0.05, read_only: bool = False,
                 context_length: Optional[int] = None) -> None:  # fmt: skip
        super().__init__()
        self.w = window
        self.session = session
        self.read_only = read_only
        self.batch_interval = batch_interval
        self.executor = EngineExecutor(lambda: Engine(cache_dir=cache_dir, use_disk=use_disk, chunk=chunk,
                                                      context_length=context_length))
        self.pending: Optional[PendingReply] = None  # the reply being generated
        self.stream_text = ""
        self.token_updates = 0  # text updates the view got (batching evidence)
        self.last_finished: Optional[Finished] = None
        self.verifying = False
        self.model_spec = ""
        self.model_name = ""
        self.model_ready = False
        self.model_info: Optional[ModelInfo] = None
        self.cache_stats: dict[str, Any] = {}
        self.mlx_memory = 0
        self.closed = False
        self.engine_closed = False  # the engine thread ended in time when the window closed
        self._cancel = CancelToken()  # the current reply's
        self._tokens: "weakref.WeakSet[CancelToken]" = weakref.WeakSet()  # every live job's
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def generating(self) -> bool:
        return self.pending is not None

    def cancel_token(self) -> CancelToken:
        """A token for a job on the engine thread; closing the window cancels it."""
        token = CancelToken()
        self._tokens.add(token)
        return token

    def _spawn(self, coro: Any) -> "asyncio.Task[Any]":
        task = jobs.spawn(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --------------------------------------------------------------------------- one reply
    def send(self, text: str) -> bool:
        """Send what the user typed (True if a reply started)."""
        if not text.strip() or self.generating:
            return False
        if self.read_only:
            self.w.show_error("Read-only", "Another Verbatim window owns this data folder.")
            return False
        try:  # one transaction: the conversation (if new), the message and the reply's row
            pending = self.session.begin_send(self.w.conv_id, text, self.model_name, self.w.default_settings())
            self.w.conv_id = pending.conversation_id
        except StoreError as e:
            self.w.show_error("Cannot save the message", str(e))
            return False
        self._start(pending)
        return True

    def regenerate(self, fresh: bool = False) -> None:
        """Regenerate (same seed and settings) or make a new variant (fresh seed) of the selected
        reply, or of the last one; answers a trailing user message that has no reply."""
        if self.generating or self.w.conv_id is None or self.read_only:
            return
        vms = self.w.message_vms()
        target = self.w.debug_target(vms)
        try:
            if vms and vms[-1].role == "user" and (target is None or target.id != self.w.chat_view.selected_id):
                pending = self.session.begin_reply_to(vms[-1].id, self.model_name)
            elif target is not None:
                pending = self.session.begin_regenerate(target.id, fresh=fresh, model_name=self.model_name)
            else:
                return
        except StoreError as e:
            self.w.show_error("Cannot regenerate", str(e))
            return
        self._start(pending)

    def edit(self, user_id: int, text: str) -> None:
        """Edit a user message as a branch and answer the edit."""
        if self.generating or self.read_only:
            self.w.status("Stop the current reply first", 3000)
            return
        try:
            pending = self.session.begin_edit(user_id, text, self.model_name)
        except StoreError as e:
            self.w.show_error("Cannot edit", str(e))
            return
        self._start(pending)

    def stop(self) -> None:
        if self.pending is not None:
            self._cancel.cancel()
            self.w.status("Stopping…", 2000)

    def _start(self, pending: PendingReply) -> None:
        self.pending = pending
        self.stream_text = ""
        self._cancel = self.cancel_token()
        self.w.chat_view.selected_id = pending.reply_id
        self._spawn(self.reply(pending, self._cancel))
        self.w.refresh_conversations()
        self.w.refresh_messages()
        self.w.chat_view.scroll_to_bottom()
        self.w.status(progress_text(pending.action, pending.request.sampler.seed))

    async def reply(self, pending: PendingReply, cancel: CancelToken) -> None:
        """Generate `pending` on the engine thread (saved there), then show the outcome."""
        job = ReplyJob(
            self.session, pending, Relay(self._show_text, self.batch_interval),
            Relay(self._show_prefill, self.batch_interval), cancel,
        )  # fmt: skip
        try:
            finished = await jobs.on_engine(self.executor, job)
        except Exception as e:
            if self.closed:
                return
            self._end_reply()
            self.w.refresh_messages()
            self.w.show_error("The reply could not be generated", jobs.user_message(e))
            return
        if self.closed:
            return
        self._end_reply()
        self.last_finished = finished
        outcome = finished.pending.outcome or finished.message.outcome
        twin = finished.pending.duplicate_of
        if twin is not None:  # identical to an existing variant: that one is shown, with this run's report
            self.w.chat_view.selected_id = twin
            self.w.debug_panel.record_run(twin, finished.result.report, outcome)
        self.w.refresh_messages()  # the sidebar was refreshed when the reply started
        if twin is not None and (shown := self.w.chat_view.widget_for(twin)) is not None:
            shown.show_identity(identity_text(outcome), "same")
        self.w.status(finished_text(finished.result, outcome), 8000)
        if finished.result.report.warnings:  # the engine hands each disk problem over once: keep it in view
            self.w.banner_text("Prompt cache: " + "; ".join(finished.result.report.warnings)
                               + " Replies still work; the cache is kept in memory only.")  # fmt: skip
        self._show_stats(finished.stats, finished.memory)

    def _show_text(self, text: str, count: int) -> None:
        if self.pending is None or self.closed:
            return
        self.stream_text = text
        self.token_updates += 1
        self.w.chat_view.stream(self.pending.reply_id, text, count)
        self.w.status(f"Generating… {count} tokens")
        self.streamed.emit(text, count)

    def _show_prefill(self, done: int, total: int) -> None:
        if self.pending is None or self.closed:
            return
        # issue 19 (ui): the reply's prefill line (with its rate and time left) on the status bar too.
        line = self.w.chat_view.prefill(self.pending.reply_id, done, total)
        self.w.status(line or f"Reading the prompt: {done:,} / {total:,}")
        self.prefilled.emit(done, total)

    def _end_reply(self) -> None:
        if self.pending is not None:
            self.w.chat_view.end_stream(self.pending.reply_id)
        self.pending = None
        self.stream_text = ""

    # ---------------------------------------------------------------------------- models
    def load_model(self, spec: str, name: Optional[str] = None) -> None:
        if self.pending is not None:
            self._cancel.cancel()
        self.model_spec = spec
        self.model_name = name or model_label(spec)
        self.model_ready = False
        self.w.show_model_loading(spec, self.model_name)
        self._spawn(self.load(spec))

    async def load(self, spec: str) -> None:
        progress = Relay(self.w.show_load_progress, self.batch_interval)
        cancel = self.cancel_token()

        def job(engine: Engine) -> tuple[ModelInfo, dict[str, Any], int]:
            info = engine.load(spec, progress=progress.progress, cancel=cancel)
            return info, engine.cache_stats(), mlx_memory()

        try:
            info, stats, memory = await jobs.on_engine(self.executor, job)
        except Exception as e:
            if not self.closed:
                self.model_ready = False
                self.model_info = None
                self.w.show_model_failed("loading cancelled" if jobs.is_cancelled(e) else jobs.user_message(e))
            return
        if self.closed:
            return
        self.model_ready = True
        self.model_info = info
        # Move everything alive now (Qt, MLX, transformers: ~100k objects) out of the cyclic GC's
        # reach, so the full collections the GC pacer runs between replies stay short. New
        # objects are still collected normally. Collect first (once, while nothing is streaming)
        # so the loader's garbage cycles are freed rather than frozen for the life of the process.
        gc.collect()
        gc.freeze()
        self.w.show_model_loaded(spec, self.model_name, info)
        self._show_stats(stats, memory)

    # ---------------------------------------------------------------------- debug panel
    def verify(self, reply_id: int) -> None:
        """Generate a stored reply again with no cache at all and compare token by token."""
        try:
            request, tokens, logprobs = self.session.verify_inputs(reply_id)
        except StoreError as e:
            self.w.debug_panel.show_verify(reply_id, str(e))
            return
        self.verifying = True
        self.w.debug_panel.set_verifying(True)
        stored = GenerationResult("", tokens, logprobs, "stop", request.sampler.seed, [], CacheReport())
        self._spawn(self._verify(reply_id, request, stored))

    async def _verify(self, reply_id: int, request: Any, stored: GenerationResult) -> None:
        cancel = self.cancel_token()
        try:
            cmp = await jobs.on_engine(self.executor, lambda engine: engine.verify(request, stored, cancel=cancel))
            text = "failed: verification cancelled" if cancel.cancelled else verify_text(cmp)
        except Exception as e:
            text = f"failed: {jobs.user_message(e)}"
        self.verifying = False
        if not self.closed:
            self.w.debug_panel.set_verifying(False)
            self.w.debug_panel.show_verify(reply_id, text)

    def clear_cache(self) -> None:
        self._spawn(self._clear_cache())
        self.w.status("Prompt cache cleared", 3000)

    async def _clear_cache(self) -> None:
        def job(engine: Engine) -> dict[str, Any]:
            engine.clear_cache()
            return engine.cache_stats()

        self._show_stats(await jobs.on_engine(self.executor, job), None)

    def _show_stats(self, stats: dict[str, Any], memory: Optional[int]) -> None:
        if self.closed:
            return
        self.cache_stats = stats
        self.w.debug_panel.show_stats(stats)
        if memory is not None:
            self.mlx_memory = memory
            self.w.update_memory()

    # ------------------------------------------------------------------------- shutdown
    def shutdown(self, timeout: float = SHUTDOWN_S) -> bool:
        """Cancel every job (a reply in progress is saved as interrupted by its job), wait for the
        engine thread to finish and close the Engine. False if it did not end in time."""
        self.closed = True
        for token in list(self._tokens):
            token.cancel()
        self.engine_closed = self.executor.shutdown(timeout)
        for task in list(self._tasks):  # their jobs are over: let the coroutines go
            task.cancel()
        return self.engine_closed
