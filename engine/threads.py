"""Thread priorities: background work must not take the cores the model step (or the GUI) needs."""

from __future__ import annotations

import os
import sys
import threading


def lower_thread_priority(nice: int) -> None:
    """Give the calling thread (and threads it starts, which inherit it) a lower CPU priority.

    Linux only: there a thread has its own nice value (keyed by its native id). On macOS the
    GPU does the model's work and per-thread nice does not apply, so this is a no-op there.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except (OSError, AttributeError):
        pass
