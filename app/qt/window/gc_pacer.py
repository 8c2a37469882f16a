"""Python's cyclic garbage collector, run on the GUI thread and never in full mid-reply.

Left automatic, a collection runs on whichever thread happens to allocate past a threshold. A
full (generation-2) collection of the test process's heap took 45-60 ms here (most likely the
150 ms GUI stall seen once on a slower CI machine); landing mid-stream it freezes the window that
long, holding the GIL, so the engine thread stops too. And a collection triggered on the engine
thread finalizes whatever cyclic garbage it finds there, Qt wrappers included, off the GUI thread.

So while a window lives, automatic collection is off and a timer on the GUI thread collects
instead: a young generation once its count passes Python's own threshold (well under a
millisecond each), the full one only once no reply has been generated for a second (the user is
reading, and the next reply rarely starts within it). `gc.freeze()` after a model load
(window.py) keeps the full collections that do run small.
"""

from __future__ import annotations

import gc
import time
from collections import Counter
from typing import Callable, Optional

from PySide6.QtCore import QObject, QTimer

TICK_MS = 100  # how often the counts are checked: a tick with nothing to do costs ~1 µs
IDLE_S = 1.0  # a full collection waits until the app has not been busy for this long


class GcPacer(QObject):
    """Owns `gc.disable()` from `start()` to `stop()`; `busy()` says a full collection must wait."""

    def __init__(
        self, busy: Callable[[], bool], parent: Optional[QObject] = None, tick_ms: int = TICK_MS, idle_s: float = IDLE_S
    ) -> None:
        super().__init__(parent)
        self._busy = busy
        self._idle_s = idle_s
        self.clock: Callable[[], float] = time.monotonic  # tests step a fake one
        self._last_busy = float("-inf")
        self._was_enabled = False
        self._active = False
        self._timer = QTimer(self)
        self._timer.setInterval(tick_ms)
        self._timer.timeout.connect(self.tick)
        self.collections: Counter[int] = Counter()  # generation -> collections run by tick()
        self.deferred = 0  # ticks on which a due full collection waited for the app to be idle
        self.longest_ms = {0: 0.0, 1: 0.0, 2: 0.0}  # slowest collection per generation

    @property
    def active(self) -> bool:
        return self._active

    def start(self) -> None:
        if self._active:
            return
        self._was_enabled = gc.isenabled()
        gc.disable()
        self._active = True
        self._timer.start()

    def stop(self) -> None:
        """Hand collection back to Python as it was before `start()`."""
        if not self._active:
            return
        self._timer.stop()
        self._active = False
        if self._was_enabled:
            gc.enable()

    def due(self, full_allowed: bool = True) -> Optional[int]:
        """The generation Python itself would collect now, or None. A full collection is due once
        enough generation-1 collections ran since the last one (the third threshold)."""
        c0, c1, c2 = gc.get_count()
        t0, t1, t2 = gc.get_threshold()
        if t0 == 0:
            return None  # collection switched off on purpose (threshold 0): respect it
        if full_allowed and c2 >= t2:
            return 2
        if c1 >= t1:
            return 1
        if c0 > t0:
            return 0
        return None

    def tick(self) -> Optional[int]:
        """Run the collection that is due, if it may run now; returns the generation collected."""
        now = self.clock()
        if self._busy():
            self._last_busy = now
        gen = self.due()
        if gen == 2 and now - self._last_busy < self._idle_s:
            self.deferred += 1
            gen = self.due(full_allowed=False)
        if gen is None:
            return None
        t = time.perf_counter()
        gc.collect(gen)
        ms = (time.perf_counter() - t) * 1000
        self.collections[gen] += 1
        self.longest_ms[gen] = max(self.longest_ms[gen], ms)
        return gen
