"""Background work, one way: a coroutine on the GUI's asyncio loop awaits a future.

- MLX work (load, generate, verify, GGUF import, cache stats) runs on the engine's one thread:
  `await on_engine(executor, fn)` runs `fn(engine)` there (`engine.executor.EngineExecutor`),
  after every job submitted before it.
- Work without MLX (model discovery, downloads) runs on a thread of its own: `await
  in_thread(fn)` (app/core/jobs.py, which the core's file reading uses too). Daemon
  threads, not the loop's default executor: a download stuck in the network must not hold up
  the process's exit.

Either way the coroutine resumes on the GUI thread, so code after an `await` may touch widgets,
and there are no job ids to check: each flow awaits its own future. A generation's events come
through engine/bridge.py (app/core/generation/model.py); an import's or a download's progress
crosses threads with `to_gui` (the loop's call_soon_threadsafe, as the bridge does; superqt's
`ensure_main_thread` moves a QObject from the calling Python thread, which crashed PySide in a
full run), throttled by superqt's `qthrottled`. Cancelling is
the job's `CancelToken`; cancelling the asyncio task only stops the coroutine waiting for it.

The loop is the qasync loop that `app.qt.main.ensure_application` installs with the
QApplication. pytest-qt drives Qt's event loop without asyncio's "running loop" being set, so
this module names the loop explicitly and never calls asyncio.get_running_loop().
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Coroutine, Optional, TypeVar

from app.core.jobs import on_daemon_thread, user_message  # noqa: F401 (user_message: the widgets' one wording)
from engine.bridge import engine_call
from engine.engine import Engine
from engine.errors import Cancelled
from engine.executor import EngineExecutor

log = logging.getLogger(__name__)
T = TypeVar("T")

_loop: Optional[asyncio.AbstractEventLoop] = None


def install_loop(loop: asyncio.AbstractEventLoop) -> None:
    global _loop
    _loop = loop


def gui_loop() -> asyncio.AbstractEventLoop:
    if _loop is None:
        raise RuntimeError("no GUI event loop: create the QApplication with app.qt.main.ensure_application()")
    return _loop


def spawn(coro: Coroutine[Any, Any, T]) -> "asyncio.Task[T]":
    """Start a coroutine on the GUI loop; an exception it lets escape is logged, not lost."""
    task = gui_loop().create_task(coro)
    task.add_done_callback(_log_failure)
    return task


def _log_failure(task: "asyncio.Task[Any]") -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("background flow failed", exc_info=task.exception())


def to_gui(fn: Callable[..., None]) -> Callable[..., None]:
    """`fn` made callable from any thread: each call runs on the GUI thread, in order."""
    loop = gui_loop()

    def call(*args: Any) -> None:
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    return call


async def on_engine(executor: EngineExecutor, fn: Callable[[Engine], T]) -> T:
    """Run fn(engine) on the engine thread and wait for it without blocking the GUI."""
    return await engine_call(executor, fn, gui_loop())


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run fn(*args) on a new daemon thread (work that never touches MLX; app/core/jobs.py)."""
    return await on_daemon_thread(gui_loop(), fn, *args)


def is_cancelled(e: BaseException) -> bool:
    return isinstance(e, Cancelled)
