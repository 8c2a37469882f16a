"""What a soak test and bench/soak.py watch in a long-running process: None's reference count,
resident memory, threads and open descriptors (Linux /proc; elsewhere what Python itself can
see), and for a window the number of live widgets. One Sample per step; Bounds says how much
each may grow after warm-up, and names every one that grew more."""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, fields
from typing import Optional


def _rss_mb(pid: Optional[int] = None) -> float:
    """Resident memory of `pid` (default: this process) in MB, from /proc (Linux) or, for this
    process elsewhere, the peak from getrusage (bytes on macOS)."""
    path = f"/proc/{pid or 'self'}/status"
    if os.path.exists(path):
        with open(path, encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def _count(folder: str) -> int:
    try:
        return len(os.listdir(folder))
    except OSError:
        return -1  # not on this system (macOS has no /proc): not compared


@dataclass(frozen=True)
class Sample:
    """One look at a process. Counts of -1: not available here (and not compared)."""

    step: int
    none_refs: int  # sys.getrefcount(None); a constant where None is immortal (3.12+)
    rss_mb: float
    threads: int  # threading.active_count(): Python threads
    tasks: int  # /proc/<pid>/task: every OS thread (Qt's, MLX's, the pool's)
    fds: int  # /proc/<pid>/fd
    widgets: int = -1  # QApplication.allWidgets(), for a window

    def line(self) -> str:
        return "  ".join(f"{f.name}={getattr(self, f.name):.1f}" if isinstance(getattr(self, f.name), float)
                         else f"{f.name}={getattr(self, f.name)}" for f in fields(self))


def sample(step: int, widgets: int = -1) -> Sample:
    """This process now."""
    return Sample(step, sys.getrefcount(None), _rss_mb(), threading.active_count(),
                  _count("/proc/self/task"), _count("/proc/self/fd"), widgets)


def sample_pid(step: int, pid: int) -> Sample:
    """Another process (a server): memory, OS threads and descriptors (no Python counts)."""
    return Sample(step, -1, _rss_mb(pid), -1, _count(f"/proc/{pid}/task"), _count(f"/proc/{pid}/fd"))


@dataclass(frozen=True)
class Bounds:
    """How much each measure may grow from the sample after warm-up to any later one; None's
    count may not fall by more than `none_refs_fall` (a leaking binding takes thousands)."""

    rss_mb: float
    widgets: int = 0
    threads: int = 0
    tasks: int = 0
    fds: int = 0
    none_refs_fall: int = 1_000

    def broken(self, warm: Sample, later: list[Sample], none_mortal: bool = True) -> list[str]:
        """Every bound a later sample broke, as readable lines (empty: all held)."""
        out = []
        for s in later:
            if none_mortal and warm.none_refs > 0 and s.none_refs < warm.none_refs - self.none_refs_fall:
                out.append(f"step {s.step}: None's count fell {warm.none_refs} -> {s.none_refs}")
            if s.rss_mb > warm.rss_mb + self.rss_mb:
                out.append(f"step {s.step}: memory {warm.rss_mb:.0f} -> {s.rss_mb:.0f} MB (bound +{self.rss_mb:.0f})")
            for name in ("widgets", "threads", "tasks", "fds"):
                a, b = getattr(warm, name), getattr(s, name)
                if a >= 0 and b >= 0 and b > a + getattr(self, name):
                    out.append(f"step {s.step}: {name} {a} -> {b} (bound +{getattr(self, name)})")
        return out


def none_is_immortal() -> bool:
    """Whether None's count is a constant (Python 3.12+, PEP 683)."""
    before = sys.getrefcount(None)
    held = [None] * 1_000
    moved = sys.getrefcount(None) - before
    del held
    return moved < 1_000
