"""The one thread that owns the Engine: every piece of MLX work runs here, in order.

MLX streams are thread-local, so the model, its caches and every array must be created and
used on one thread. (The one other thread that calls MLX, the disk writer, only slices and
saves snapshot arrays this thread has already evaluated: engine/cache/disk/tier.py, "Threads".) `EngineExecutor` is a single-worker `ThreadPoolExecutor` whose initializer
creates the Engine on that thread; `submit(fn)` runs `fn(engine)` there and returns a
`concurrent.futures.Future`. The GUI awaits those futures on its asyncio (qasync) loop, the
local server does the same on its own loop, and the CLI simply calls the Engine directly.
`swap(make_engine)` replaces the engine on that same thread (the window attached to a server:
engine/remote.py), so whoever holds the executor keeps using it.
"""

from __future__ import annotations

import concurrent.futures
import logging
from typing import Any, Callable, Optional, TypeVar

from engine.engine import Engine
from engine.errors import EngineError, VerbatimError
from engine.threads import lower_thread_priority

log = logging.getLogger(__name__)
T = TypeVar("T")
ENGINE_NICE = 5  # below the GUI thread (0), above the disk writer (19)


class EngineExecutor:
    def __init__(self, make_engine: Callable[[], Any], name: str = "verbatim-engine") -> None:
        """`make_engine()` builds the engine on the engine thread: an `Engine`, or anything that
        implements engine/bridge.py's `EngineAPI` (a `RemoteEngine`)."""
        self._make_engine = make_engine
        self._engine: Optional[Any] = None
        self._start_error: Optional[str] = None
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=name, initializer=self._start)

    def _start(self) -> None:
        lower_thread_priority(ENGINE_NICE)
        try:
            self._engine = self._make_engine()
        except Exception as e:  # e.g. an unwritable cache dir: every job reports it
            log.exception("cannot create the engine")
            self._start_error = str(e) if isinstance(e, VerbatimError) else f"{type(e).__name__}: {e}"

    def _call(self, fn: Callable[[Engine], T]) -> T:
        if self._engine is None:
            raise EngineError(f"the engine could not start: {self._start_error}")
        return fn(self._engine)

    def submit(self, fn: Callable[[Engine], T]) -> "concurrent.futures.Future[T]":
        """Run `fn(engine)` on the engine thread, after every job submitted before it."""
        return self._pool.submit(self._call, fn)

    def swap(self, make_engine: Callable[[], T]) -> "concurrent.futures.Future[T]":
        """Replace the engine, after every job submitted before: `make_engine()` runs on the
        engine thread; when it succeeds the old engine is closed and the new one serves every
        later job; when it raises, the old one stays and the future carries the error."""
        return self._pool.submit(self._swap, make_engine)

    def _swap(self, make_engine: Callable[[], T]) -> T:
        new = make_engine()
        old, self._engine, self._start_error = self._engine, new, None
        if old is not None:
            try:
                old.close()
            except Exception:
                log.exception("engine close failed")
            del old
            import mlx.core as mx

            mx.clear_cache()  # the old model's buffers go back to the system now
        return new

    def shutdown(self, timeout: Optional[float] = None) -> bool:
        """Let the submitted jobs end (cancel them first), then close the Engine on its thread.
        Returns False if that did not happen within `timeout` seconds."""
        closing = self._pool.submit(self._close)
        self._pool.shutdown(wait=False, cancel_futures=False)
        try:
            closing.result(timeout)
        except concurrent.futures.TimeoutError:
            return False
        return True

    def _close(self) -> None:
        if self._engine is not None:
            try:
                self._engine.close()
            except Exception:
                log.exception("engine close failed")
            self._engine = None
        # MLX streams are per thread; left for the interpreter to tear down at exit, they abort
        # the process now and then ("terminate called without an active exception"). MLX's
        # recommendation: clear them at the end of the thread that made them.
        import mlx.core as mx

        mx.clear_streams()
