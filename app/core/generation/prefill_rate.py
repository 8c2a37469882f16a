"""Prefill progress as the user reads it: tokens read so far, the rate, and about how long is left.

"Reading the prompt: 4,608 / 6,517 · 27 tok/s · about 1 min left". The rate is the average since
the first progress event of this prefill (restored tokens are not counted as read), so it is
steady rather than jumping with each chunk. The clock is injected: tests step it by hand.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Optional


def time_left_text(seconds: float) -> str:
    """'about 40 s left', 'about 1 min left', 'about 1 h 5 min left'."""
    if seconds < 60:
        return f"about {max(1, math.ceil(seconds))} s left"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"about {minutes} min left"
    return f"about {minutes // 60} h {minutes % 60} min left"


def rate_text(tps: float) -> str:
    return f"{tps:,.0f} tok/s" if tps >= 10 else f"{tps:.1f} tok/s"


@dataclass
class PrefillRate:
    """Feed it each PrefillProgress (done, total); it answers the line to show."""

    clock: Callable[[], float] = time.monotonic
    _first: Optional[tuple[float, int]] = field(default=None, repr=False)  # (when, done) at the first event
    tps: Optional[float] = None  # tokens per second since the first event (None: not known yet)
    seconds_left: Optional[float] = None

    def update(self, done: int, total: int) -> str:
        now = self.clock()
        if self._first is None or done < self._first[1]:  # a new prefill (or the first event)
            self._first = (now, done)
            self.tps = self.seconds_left = None
        else:
            t0, d0 = self._first
            if now > t0 and done > d0:
                self.tps = (done - d0) / (now - t0)
                self.seconds_left = max(total - done, 0) / self.tps
        return self.text(done, total)

    def text(self, done: int, total: int) -> str:
        parts = [f"Reading the prompt: {done:,} / {total:,}"]
        if self.tps is None and done < total:  # a chunk can take seconds: say what is under way
            parts.append("the first chunk is being read (rate and time left after it)")
        if self.tps is not None:
            parts.append(rate_text(self.tps))
            if self.seconds_left:
                parts.append(time_left_text(self.seconds_left))
        return " · ".join(parts)
