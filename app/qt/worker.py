"""The engine worker: one thread that owns the Engine and runs every MLX job, in order.

MLX streams are thread-local, so the Engine is created, the model loaded and every generation
run on this one thread; the GUI thread only enqueues jobs and receives Qt signals (queued
connections, since the worker object lives on the GUI thread and emits from this thread).

Token updates are batched here: a signal carries all text decoded since the previous one and
is emitted at most every `batch_interval` seconds (the first token goes out at once), so the
view repaints ~20 times a second rather than once per token. Each job has a CancelToken;
`cancel(job_id)` stops a generation between prefill chunks or decode steps.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from PySide6.QtCore import QObject, Signal

from app.core.session import ChatSession, PendingReply
from engine.threads import lower_thread_priority
from engine.types import CancelToken, GenerationResult, PrefillProgress, TokenEvent

log = logging.getLogger(__name__)

Progress = Callable[[float, str], None]
TaskFn = Callable[[Progress, CancelToken], Any]
PARTIAL_SAVE_S = 5.0  # how often a long reply's streamed text is written to the store


@dataclass
class Finished:
    """A generation that ran to its end (stop, length or cancel), already saved."""

    pending: PendingReply
    result: GenerationResult
    message: Any  # app.core.store.Message as saved


@dataclass
class _Job:
    id: int
    kind: str
    args: tuple[Any, ...]
    cancel: CancelToken = field(default_factory=CancelToken)


def user_message(e: BaseException) -> str:
    """One line for the window: user-caused errors carry their own message."""
    from app.core.store import StoreError
    from engine.errors import EngineError, RequestError

    known: tuple[type[BaseException], ...] = (EngineError, RequestError, StoreError, OSError)
    try:
        from engine.errors import ModelError

        known += (ModelError,)
    except ImportError:
        pass
    try:
        from engine.errors import GGUFError

        known += (GGUFError,)
    except ImportError:
        pass
    if isinstance(e, known):
        return str(e) or type(e).__name__
    return f"{type(e).__name__}: {e}"


def is_cancelled_error(e: BaseException) -> bool:
    try:
        from engine.errors import Cancelled
    except ImportError:
        return False
    return isinstance(e, Cancelled)


WORKER_NICE = 5


class EngineWorker(QObject):
    loadProgress = Signal(float, str)
    modelLoaded = Signal(object)  # engine.engine.ModelInfo
    modelFailed = Signal(str, str)  # spec, message
    prefill = Signal(int, int, int)  # job, done, total
    tokens = Signal(int, str, int)  # job, text decoded since the last signal, tokens so far
    generated = Signal(int, object)  # job, Finished
    generationFailed = Signal(int, str)  # job, message
    verified = Signal(int, object)  # job, engine.types.Comparison
    verifyFailed = Signal(int, str)
    cacheStats = Signal(object)  # dict from Engine.cache_stats()
    memory = Signal(int)  # MLX active memory in bytes
    taskProgress = Signal(int, float, str)
    taskDone = Signal(int, object)
    taskFailed = Signal(int, str)  # job, message ("cancelled" when cancelled)
    busyChanged = Signal(bool)

    def __init__(
        self,
        session: Optional[ChatSession],
        cache_dir: Optional[Path],
        chunk: int = 512,
        use_disk: bool = True,
        batch_interval: float = 0.05,
        parent: Optional[QObject] = None,
    ) -> None:
        super().__init__(parent)
        self.session = session
        self.cache_dir = cache_dir
        self.chunk = chunk
        self.use_disk = use_disk
        self.batch_interval = batch_interval
        self._queue: "queue.Queue[Optional[_Job]]" = queue.Queue()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._jobs: dict[int, _Job] = {}  # queued or running
        self._current: Optional[_Job] = None
        self._thread = threading.Thread(target=self._run, name="verbatim-engine", daemon=True)
        self._engine: Any = None
        self._stopping = False
        self.token_signals = 0  # how many `tokens` signals were emitted (batching evidence)

    # -- GUI thread API --------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def load(self, spec: str) -> int:
        return self._submit("load", spec)

    def generate(self, pending: PendingReply) -> int:
        return self._submit("generate", pending)

    def verify(self, request: Any, tokens: list[int], logprobs: list[float]) -> int:
        return self._submit("verify", request, tokens, logprobs)

    def clear_cache(self) -> int:
        return self._submit("clear")

    def refresh_stats(self) -> int:
        return self._submit("stats")

    def run_task(self, fn: TaskFn) -> int:
        """Run fn(progress, cancel) on the engine thread (for work that uses MLX, e.g. GGUF import)."""
        return self._submit("task", fn)

    def submit(self, fn: Callable[[Any], Any]) -> "concurrent.futures.Future[Any]":
        """Run `fn(engine)` on the engine thread, in order with every other job, and return its
        result as a Future: the `EngineExecutor` interface (the local server uses it, so its
        requests and the window's own work never run MLX at the same time)."""
        fut: "concurrent.futures.Future[Any]" = concurrent.futures.Future()
        if self._stopping:
            fut.set_exception(RuntimeError("the engine worker has stopped"))
            return fut
        self._submit("call", fn, fut)
        return fut

    def cancel(self, job_id: int) -> None:
        with self._lock:
            job = self._jobs.get(job_id)
        if job is not None:
            job.cancel.cancel()

    def cancel_all(self) -> None:
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            job.cancel.cancel()

    @property
    def busy(self) -> bool:
        with self._lock:
            return bool(self._jobs)

    def shutdown(self, timeout: float = 15.0) -> bool:
        """Cancel everything, let the running job save what it has, stop the thread.
        Returns False if the thread did not end in time (it is a daemon: exit still works)."""
        self._stopping = True
        self.cancel_all()
        self._queue.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout)
        while True:  # jobs queued behind the stop never run: their futures must still end
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None and job.kind == "call":
                job.args[1].cancel()
        return not self._thread.is_alive()

    def _submit(self, kind: str, *args: Any) -> int:
        job = _Job(next(self._ids), kind, args)
        with self._lock:
            self._jobs[job.id] = job
            was_idle = len(self._jobs) == 1
        if self._stopping:
            job.cancel.cancel()
        self._queue.put(job)
        if was_idle:
            self.busyChanged.emit(True)
        return job.id

    # -- worker thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        from engine.engine import Engine

        lower_thread_priority(WORKER_NICE)
        engine_error: Optional[str] = None
        try:
            self._engine = Engine(cache_dir=self.cache_dir, use_disk=self.use_disk, chunk=self.chunk)
        except Exception as e:  # e.g. an unwritable cache dir: every job reports it
            engine_error = user_message(e)
            log.exception("cannot create the engine")
        try:
            while True:
                job = self._queue.get()
                if job is None:
                    break
                with self._lock:
                    self._current = job
                try:
                    if engine_error is not None:
                        self._fail(job, f"the engine could not start: {engine_error}")
                    else:
                        self._dispatch(job)
                except Exception as e:  # never let one job kill the thread
                    log.error("job %s failed:\n%s", job.kind, traceback.format_exc())
                    self._fail(job, user_message(e))
                finally:
                    with self._lock:
                        self._current = None
                        self._jobs.pop(job.id, None)
                        idle = not self._jobs
                    if idle and not self._stopping:
                        self.busyChanged.emit(False)
        finally:
            if self._engine is not None:
                try:
                    self._engine.close()
                except Exception:
                    log.exception("engine close failed")

    def _dispatch(self, job: _Job) -> None:
        getattr(self, f"_do_{job.kind}")(job, *job.args)

    def _fail(self, job: _Job, message: str) -> None:
        if job.kind == "generate":
            pending: PendingReply = job.args[0]
            if self.session is not None:
                self.session.fail(pending)
            self.generationFailed.emit(job.id, message)
        elif job.kind == "load":
            self.modelFailed.emit(job.args[0], message)
        elif job.kind == "verify":
            self.verifyFailed.emit(job.id, message)
        elif job.kind == "call":
            fut = job.args[1]
            if not fut.done():
                fut.set_exception(RuntimeError(message))
        else:
            self.taskFailed.emit(job.id, message)

    def _emit_memory(self) -> None:
        try:
            import mlx.core as mx

            self.memory.emit(int(mx.get_active_memory()))
        except Exception:
            pass

    def _do_load(self, job: _Job, spec: str) -> None:
        last = [0.0]

        def progress(fraction: float, message: str) -> None:
            now = time.perf_counter()
            if now - last[0] >= self.batch_interval or fraction >= 1.0:
                last[0] = now
                self.loadProgress.emit(float(fraction), str(message))

        try:
            info = self._engine.load(spec, progress=progress, cancel=job.cancel)
        except Exception as e:
            msg = "loading cancelled" if is_cancelled_error(e) else user_message(e)
            self.modelFailed.emit(spec, msg)
            return
        self.modelLoaded.emit(info)
        self._emit_memory()
        self.cacheStats.emit(self._engine.cache_stats())

    def _do_generate(self, job: _Job, pending: PendingReply) -> None:
        pieces: list[str] = []  # everything decoded (for partial saves)
        batch: list[str] = []
        state = {"last": 0.0, "count": 0, "saved": time.perf_counter(), "prefill": 0.0}

        def flush() -> None:
            text = "".join(batch)
            batch.clear()
            if text:
                self.tokens.emit(job.id, text, state["count"])
                self.token_signals += 1

        def on_event(ev: Any) -> None:
            now = time.perf_counter()
            if isinstance(ev, TokenEvent):
                pieces.append(ev.text)
                batch.append(ev.text)
                state["count"] = ev.index + 1
                # The first text at once, then at most one signal per interval.
                if any(batch) and (state["last"] == 0.0 or now - state["last"] >= self.batch_interval):
                    state["last"] = now
                    flush()
                if self.session is not None and now - state["saved"] >= PARTIAL_SAVE_S:
                    state["saved"] = now
                    self.session.save_partial(pending, "".join(pieces))
            elif isinstance(ev, PrefillProgress):
                if ev.done in (0, ev.total) or now - state["prefill"] >= self.batch_interval:
                    state["prefill"] = now
                    self.prefill.emit(job.id, ev.done, ev.total)

        try:
            result = self._engine.generate(pending.request, on_event=on_event, cancel=job.cancel)
        except Exception as e:
            if self.session is not None:
                self.session.fail(pending, "".join(pieces))
            self.generationFailed.emit(job.id, user_message(e))
            return
        flush()
        message = self.session.finish(pending, result) if self.session is not None else None
        self.generated.emit(job.id, Finished(pending, result, message))
        self._emit_memory()
        self.cacheStats.emit(self._engine.cache_stats())

    def _do_verify(self, job: _Job, request: Any, tokens: list[int], logprobs: list[float]) -> None:
        from engine.types import CacheReport

        stored = GenerationResult("", tokens, logprobs, "stop", request.sampler.seed, [], CacheReport())
        cmp = self._engine.verify(request, stored, cancel=job.cancel)
        if job.cancel.cancelled:
            self.verifyFailed.emit(job.id, "verification cancelled")
            return
        self.verified.emit(job.id, cmp)

    def _do_clear(self, job: _Job) -> None:
        self._engine.clear_cache()
        self.cacheStats.emit(self._engine.cache_stats())

    def _do_stats(self, job: _Job) -> None:
        self.cacheStats.emit(self._engine.cache_stats())
        self._emit_memory()

    def _do_call(self, job: _Job, fn: Callable[[Any], Any], fut: "concurrent.futures.Future[Any]") -> None:
        if not fut.set_running_or_notify_cancel():
            return  # cancelled while it waited
        try:
            fut.set_result(fn(self._engine))
        except BaseException as e:  # the caller gets every failure, as from an executor
            fut.set_exception(e)

    def _do_task(self, job: _Job, fn: TaskFn) -> None:
        def progress(fraction: float, message: str) -> None:
            self.taskProgress.emit(job.id, float(fraction), str(message))

        try:
            out = fn(progress, job.cancel)
        except Exception as e:
            self.taskFailed.emit(job.id, "cancelled" if is_cancelled_error(e) else user_message(e))
            return
        if job.cancel.cancelled:
            self.taskFailed.emit(job.id, "cancelled")
            return
        self.taskDone.emit(job.id, out)
