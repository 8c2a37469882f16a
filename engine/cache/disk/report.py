"""What the disk tier tells: its counters and its user-facing warnings (each problem once).

Both threads report (the engine thread counts loads and skips, the writer writes and errors),
so `Report` has its own small lock: it never waits for anything but another report. Every field
is written by `Report`'s own methods, under that lock; the others read through `counters()`,
`stats()` and `pop_warnings()`.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Optional

from engine.cache.kinds import SnapshotKind

log = logging.getLogger(__name__)

READ_ONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)


@dataclass
class Counters:
    writes: int = 0
    write_errors: int = 0
    write_seconds: float = 0.0
    bytes_written: int = 0
    loads: int = 0
    load_errors: int = 0
    evictions: int = 0
    skipped: int = 0
    dropped: int = 0
    rejected: int = 0
    temps_removed: int = 0
    orphans_removed: int = 0
    index_reloads: int = 0  # a reader's re-reads of the writer's index


@dataclass
class Report:
    """Counters, the last write log, the last error and the warnings of one tier."""

    on_warning: Optional[Callable[[str], None]] = None
    counts: Counters = field(default_factory=Counters)
    write_log: list[tuple[SnapshotKind, int, int, float]] = field(default_factory=list)  # (kind, tokens, bytes, s)
    last_error: Optional[str] = None
    warnings: list[str] = field(default_factory=list)
    _warned: set[str] = field(default_factory=set)
    _unseen: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, name: str, n: float = 1) -> None:
        with self._lock:
            setattr(self.counts, name, getattr(self.counts, name) + n)

    def opened(self, rejected: int) -> None:
        """The index was (re-)read: `rejected` pack rows and manifests were dropped on the way."""
        with self._lock:
            self.counts.rejected = rejected

    def listen(self, on_warning: Optional[Callable[[str], None]]) -> None:
        """Call `on_warning` with each new warning from now on (None: nobody)."""
        with self._lock:
            self.on_warning = on_warning

    def wrote(self, kind: SnapshotKind, tokens: int, nbytes: int, seconds: float) -> None:
        with self._lock:
            c = self.counts
            c.writes, c.write_seconds, c.bytes_written = c.writes + 1, c.write_seconds + seconds, c.bytes_written + nbytes
            self.write_log.append((kind, tokens, nbytes, seconds))
            del self.write_log[:-64]

    def counters(self) -> dict[str, Any]:
        with self._lock:
            return {f.name: getattr(self.counts, f.name) for f in fields(Counters)}

    def stats(self) -> dict[str, Any]:
        """The counters, the last error and the warnings, as the tier's `stats()` shows them."""
        c = self.counters()
        names = ("writes", "write_errors", "bytes_written", "loads", "load_errors", "evictions", "skipped", "dropped")
        return {**{k: c[k] for k in names}, "write_seconds": round(c["write_seconds"], 4),
                "rejected_on_open": c["rejected"], "temps_removed_on_open": c["temps_removed"],
                "orphans_removed_on_open": c["orphans_removed"], "last_error": self.last_error,
                "warnings": list(self.warnings)}

    def error(self, message: str) -> None:
        with self._lock:
            self.last_error = message

    def write_failed(self, e: BaseException, root: Any) -> bool:
        """Count a failed write, tell the user once; True if the folder cannot be written any
        more (read-only, no permission: those do not go away by themselves)."""
        code = getattr(e, "errno", None)
        msg = f"{type(e).__name__}: {e}"
        with self._lock:
            self.counts.write_errors += 1
            self.last_error = msg
        if code == errno.ENOSPC:
            self.warn("enospc", f"The disk is full: prompt cache snapshots are not being saved to {root} "
                                "(replies are unaffected; the cache works in memory).")
        elif code in READ_ONLY_ERRNOS:
            self.warn("readonly", f"The prompt cache folder {root} is not writable ({os.strerror(code)}); "
                                  "the cache works in memory only this session.")
        else:
            self.warn("write", f"Saving the prompt cache to disk failed ({msg}); replies are unaffected.")
        return code in READ_ONLY_ERRNOS

    def warn(self, kind: str, message: str) -> None:
        with self._lock:
            if kind in self._warned:
                return
            self._warned.add(kind)
            self.warnings.append(message)
            self._unseen += 1
            listener = self.on_warning
        log.warning("%s", message)  # once per kind, like the report's warning
        if listener is not None:
            try:
                listener(message)
            except Exception:
                pass

    def pop_warnings(self) -> list[str]:
        """Warnings not yet shown to the user (each problem is reported once)."""
        with self._lock:
            new = self.warnings[len(self.warnings) - self._unseen :] if self._unseen else []
            self._unseen = 0
            return new
