"""Where the app's work runs (no Qt): the engine thread, reached through engine/bridge.py and
awaited on the GUI's asyncio loop, and daemon threads for work that never touches MLX.

`EngineJobs` is what every sub-model that waits on the engine is given: `call(fn)` awaits
`fn(engine)` on the engine thread (after every job before it), `cancel_token()` makes a token
that closing the window cancels, `spawn(coro)` starts a coroutine on the loop. The loop is named,
never asked for: pytest-qt drives Qt's event loop without asyncio's "running loop" set
(app/qt/jobs.py). Daemon threads, not the loop's default executor: a download stuck in the
network or a read stuck on a slow disk must not hold up the process's exit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import weakref
from typing import Any, Callable, Coroutine, TypeVar

from app.core.store import StoreError
from engine.bridge import engine_call
from engine.errors import VerbatimError
from engine.executor import EngineExecutor
from engine.types import CancelToken

T = TypeVar("T")


class EngineJobs:
    """The engine thread and the loop of one window, and every job it has started."""

    def __init__(self, executor: EngineExecutor, loop: asyncio.AbstractEventLoop,
                 spawn: Callable[[Coroutine[Any, Any, Any]], "asyncio.Task[Any]"]) -> None:  # fmt: skip
        self.executor = executor
        self.loop = loop
        self._spawn_on_loop = spawn
        self._tokens: "weakref.WeakSet[CancelToken]" = weakref.WeakSet()  # every live engine job's
        self._tasks: set[asyncio.Task[Any]] = set()
        self.closed = False

    def call(self, fn: Callable[[Any], T]) -> "asyncio.Future[T]":
        """Await `fn(engine)` on the engine thread (after every job before it)."""
        return engine_call(self.executor, fn, self.loop)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> "asyncio.Task[Any]":
        task = self._spawn_on_loop(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def cancel_token(self) -> CancelToken:
        """A token for a job on the engine thread; closing the window cancels it."""
        token = CancelToken()
        self._tokens.add(token)
        return token

    def release(self, token: CancelToken) -> None:
        """The job of `token` is over: closing the window need not cancel it."""
        self._tokens.discard(token)

    def in_thread(self, fn: Callable[..., T], *args: Any, name: str = "verbatim-task") -> "asyncio.Future[T]":
        """`fn(*args)` on a daemon thread of its own, awaited on this loop."""
        return on_daemon_thread(self.loop, fn, *args, name=name)

    def shutdown(self, timeout: float) -> bool:
        """Cancel every engine job, wait for the engine thread and close the Engine; then let the
        coroutines waiting on them go. False if the engine thread did not end in time."""
        self.closed = True
        for token in list(self._tokens):
            token.cancel()
        ended = self.executor.shutdown(timeout)
        for task in list(self._tasks):  # their jobs are over
            task.cancel()
        return ended


def on_daemon_thread(loop: asyncio.AbstractEventLoop, fn: Callable[..., T], *args: Any,
                     name: str = "verbatim-task") -> "asyncio.Future[T]":  # fmt: skip
    """Run fn(*args) on a new daemon thread; a future of its result on `loop`."""
    fut: "concurrent.futures.Future[T]" = concurrent.futures.Future()

    def run() -> None:
        if not fut.set_running_or_notify_cancel():
            return
        try:
            fut.set_result(fn(*args))
        except BaseException as e:  # handed to the awaiting coroutine
            fut.set_exception(e)

    threading.Thread(target=run, name=name, daemon=True).start()
    return asyncio.wrap_future(fut, loop=loop)


def user_message(e: BaseException) -> str:
    """One line for the window: the errors users cause carry their own message."""
    if isinstance(e, (VerbatimError, StoreError, OSError)):
        return str(e) or type(e).__name__
    return f"{type(e).__name__}: {e}"


def mlx_memory() -> int:
    """MLX active memory in bytes (engine thread), 0 if unknown."""
    try:
        import mlx.core as mx

        return int(mx.get_active_memory())
    except Exception:
        return 0
