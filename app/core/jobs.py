"""Work that never touches MLX, on a daemon thread of its own, awaited on a named loop (no Qt).

Daemon threads, not the loop's default executor: a download stuck in the network or a read
stuck on a slow disk must not hold up the process's exit. The loop is named, never asked for:
pytest-qt drives Qt's event loop without asyncio's "running loop" set (app/qt/jobs.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Callable, TypeVar

T = TypeVar("T")


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
