"""The disk tier of the prompt cache: snapshots that survive restarts (G2).

Layout under the cache root (``platformdirs.user_cache_dir("Verbatim")/prompt-cache`` or the
``--cache-dir`` given)::

    index.json                    every entry's SnapshotMeta + file size + sha256 of the file
    snapshots/<id>.safetensors    one snapshot: each layer's state (arrays as tensors, the rest
                                  as JSON in the safetensors metadata, with the meta fields again)
    .lock                         flock held by the one process allowed to write

Invariants, and why they hold:

- A file under its final name is complete: it is written as ``snapshots/.tmp-*``, fsynced, and
  only then renamed. Temp files are never entries and are deleted on open.
- The index is written (temp + fsync + rename) *before* the snapshot file is renamed into place,
  so a crash leaves at worst an index entry without a file (dropped on open), never an unlisted
  file. A file the index does not list (only possible if index.json was lost or damaged) is
  deleted on open: without its checksum nothing vouches for its bytes, and it is only a cache.
- ``load()`` reads the file once, checks its sha256 and its header against the index entry, and
  only then builds cache objects: a flipped, truncated, swapped or missing file raises
  ``SnapshotError`` and its entry is removed. Nothing partial is ever restored.
- Only ids accepted by ``format.is_snapshot_id`` ever become paths, so no index content can
  reach outside the root.
- Each entry records the compute environment (MLX and mlx-lm versions, device, BLAS libraries):
  a state computed by other kernels is not bit-equal to a cold run here (G3), and unlike the
  memory tier the disk outlives an app update or a BLAS change. Entries from another environment
  are kept (within the budget) but never returned.
- All disk I/O (snapshot files, index, deletions) runs on one writer thread; ``save_async`` only
  appends to a queue. Snapshot arrays are already evaluated (``clone_cache``), so serialising them
  off the engine thread needs no MLX stream (checked: ``mx.save_safetensors`` works there).
- I/O errors (disk full, read-only dir) never reach the generation: they are counted, the first
  one becomes a user-facing warning, and the memory tier keeps working.

tier.py holds `DiskCache`: its API, opening a folder (lock, index, stray files), reading, and
the reader that follows another instance's writes. writer.py holds its writer thread (queue,
holds, saves, eviction, index writes, error reporting), format.py the file format, index.py
the index, files.py file primitives, hooks.py the writer's observation points.
"""

from __future__ import annotations

import atexit
import errno
import os
import shutil
import threading
import time
import weakref
from collections import deque
from pathlib import Path
from typing import Any, Callable, Optional

from engine.cache.disk.files import unlink
from engine.cache.disk.format import Entry, compute_env, decode_snapshot
from engine.cache.disk.hooks import NO_HOOKS, WriterHooks
from engine.cache.disk.index import Index, read_index, stray_files
from engine.cache.disk.writer import MAX_PENDING_BYTES, TMP_PREFIX, WriterThread, WriteTask
from engine.cache.families import persisted
from engine.cache.planner import SnapshotMeta
from engine.cache.snapshot import Snapshot
from engine.errors import SnapshotError
from engine.paths import prompt_cache_dir

INDEX_NAME = "index.json"
SNAP_DIR = "snapshots"
LOCK_NAME = ".lock"
LOCKED = "another Verbatim instance is using this prompt cache"
DEFAULT_MAX_BUDGET = 10 << 30
DEFAULT_FREE_FRACTION = 0.25
READER_POLL_S = 1.0  # a reader (another instance writes) looks at the index and the lock this often


class DiskCache(WriterThread):
    """The persistent tier behind `PromptCache` (satisfies `prompt_cache.DiskTier`).

    The index lives in memory (loaded and validated once on open, kept in sync by the writer
    thread), so `entries()` never touches the disk. Only the engine thread calls `load()`.
    """

    def __init__(
        self,
        root: Optional[Path | str] = None,
        budget_bytes: Optional[int] = None,
        on_warning: Optional[Callable[[str], None]] = None,
        max_pending_bytes: int = MAX_PENDING_BYTES,
        hooks: WriterHooks = NO_HOOKS,
    ) -> None:
        self.root = Path(root).expanduser() if root is not None else prompt_cache_dir()
        self.snap_dir = self.root / SNAP_DIR
        self.index_path = self.root / INDEX_NAME
        self.on_warning = on_warning
        self.max_pending_bytes = max_pending_bytes
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._queue: deque[WriteTask] = deque()
        self._pending_bytes = 0
        self._busy = False
        self._holds = 0  # generations in progress: the writer waits for them (see hold_writes)
        self._flushers = 0  # callers in flush(): a hold must not make them wait for ever
        self._stop = False
        self._dirty = False
        self._lock_fd: Optional[int] = None
        self.hooks = hooks
        self.env = compute_env()
        self._index = Index(self.env)
        # stats
        self.writes = 0
        self.write_errors = 0
        self.write_seconds = 0.0
        self.bytes_written = 0
        self.loads = 0
        self.load_errors = 0
        self.evictions = 0
        self.skipped = 0
        self.dropped = 0
        self.rejected = 0
        self.temps_removed = 0
        self.orphans_removed = 0
        self.write_log: list[tuple[str, int, int, float]] = []  # (kind, tokens, bytes, seconds)
        self._retry_at = 0.0
        self.last_error: Optional[str] = None
        self.warnings: list[str] = []
        self._warned: set[str] = set()
        self._unseen = 0
        self.writable = False
        self.enabled = False
        self.read_only_reason: Optional[str] = None
        self._index_stamp: Optional[tuple[int, int, int]] = None  # what a reader last read
        self._next_poll = 0.0
        self.index_reloads = 0  # a reader's re-reads of the writer's index
        self.took_over = False  # a reader that became the writer when the other instance exited

        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self.writable = self._acquire_lock()
            if self.writable:
                self.snap_dir.mkdir(exist_ok=True)
            self.enabled = True
        except OSError as e:
            self.writable = False
            self._warn("open", f"Prompt cache folder {self.root} is not usable ({e.strerror or e}); "
                               "the cache works in memory only this session.")
            self.last_error = str(e)
        if budget_bytes is None:
            budget_bytes = self._default_budget()
        self.budget_bytes = int(budget_bytes)
        if self.enabled:
            self._index_stamp = self._stamp()
            self._open_index()
        self._thread: Optional[threading.Thread] = None
        if self.writable:
            self._start_writer()

    def _start_writer(self) -> None:
        self._queue.append(WriteTask("sync"))  # apply the budget (it may have shrunk) off this thread
        self._thread = threading.Thread(target=self._run, name="verbatim-disk-cache", daemon=True)
        self._thread.start()
        # Best effort on exit without close(): pending writes get a short grace period.
        ref = weakref.ref(self)
        atexit.register(lambda: (c := ref()) is not None and c.close(timeout=10.0))

    # -- DiskTier protocol -------------------------------------------------------------------
    def entries(self, model_key: str) -> list[SnapshotMeta]:
        self.poll()
        with self._lock:
            return self._index.metas(model_key)

    # -- a reader: another instance writes -----------------------------------------------------
    def _stamp(self) -> Optional[tuple[int, int, int]]:
        try:
            st = os.stat(self.index_path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)  # the writer replaces it: a new inode

    def poll(self, force: bool = False) -> None:
        """A reader (the folder's lock is another instance's): at most every READER_POLL_S, take
        the lock if that instance has exited (and become the writer), else re-read the index if
        the writer replaced it since. No-op for the writer."""
        if self.writable or not self.enabled or self.read_only_reason != LOCKED:
            return
        now = time.monotonic()
        with self._lock:
            if self._stop or (not force and now < self._next_poll):
                return
            self._next_poll = now + READER_POLL_S
            if self._try_lock():
                self.writable, self.took_over, self.read_only_reason = True, True, None
                self.snap_dir.mkdir(exist_ok=True)
                self._reload_index()
                self._start_writer()
                return
            stamp = self._stamp()
            if stamp != self._index_stamp:
                self._index_stamp = stamp
                self._reload_index()
                self.index_reloads += 1

    def _reload_index(self) -> None:
        self._index = Index(self.env)
        self._open_index()

    def load(self, meta: SnapshotMeta) -> Snapshot:
        """Read, verify and rebuild a snapshot (on the calling thread, which owns the arrays)."""
        with self._lock:
            entry = self._index.get(meta.id)
        if entry is None:
            raise SnapshotError("not in the disk index")
        try:
            snap = self._read(entry)
        except SnapshotError as e:
            self.load_errors += 1
            self.remove(meta.id)
            raise e
        with self._lock:
            entry = self._index.get(meta.id)
            if entry is not None:
                entry.last_used = time.time()
                self._dirty = True
                self._cond.notify()
        self.loads += 1
        return snap

    def save_async(self, snapshot: Snapshot) -> None:
        """Queue a snapshot for writing; returns at once (no disk I/O on the caller's thread)."""
        if not self.writable:
            return
        if not all(persisted(c) for c in snapshot.meta.classes):
            self.skipped += 1
            return
        with self._lock:
            if self._stop:
                return
            self._queue.append(WriteTask("save", snapshot, nbytes=snapshot.meta.nbytes))
            self._pending_bytes += snapshot.meta.nbytes
            # A writer far behind must not pin unbounded memory: drop the oldest pending saves.
            while self._pending_bytes > self.max_pending_bytes:
                old = next((t for t in self._queue if t.kind == "save"), None)
                if old is None or old.snapshot is snapshot:
                    break
                self._queue.remove(old)
                self._pending_bytes -= old.nbytes
                self.dropped += 1
            self._cond.notify()

    def remove(self, snapshot_id: str) -> None:
        with self._lock:
            if self._index.drop(snapshot_id) is None:
                return
            if self.writable:
                self._queue.append(WriteTask("delete", ids=[snapshot_id]))
                self._cond.notify()

    def clear(self) -> None:
        with self._lock:
            self._index.clear()
            if self.writable:
                self._queue.append(WriteTask("clear"))
                self._cond.notify()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "dir": str(self.root),
                "env": self.env,
                "entries": len(self._index),
                "entries_other_env": self._index.other_env(),
                "bytes": self._index.total_bytes(),
                "budget_bytes": self.budget_bytes,
                "writable": self.writable,
                "pending": sum(1 for t in self._queue if t.kind == "save") + (1 if self._busy else 0),
                "writes": self.writes,
                "write_errors": self.write_errors,
                "write_seconds": round(self.write_seconds, 4),
                "bytes_written": self.bytes_written,
                "loads": self.loads,
                "load_errors": self.load_errors,
                "evictions": self.evictions,
                "skipped": self.skipped,
                "dropped": self.dropped,
                "rejected_on_open": self.rejected,
                "temps_removed_on_open": self.temps_removed,
                "orphans_removed_on_open": self.orphans_removed,
                "last_error": self.last_error,
                "warnings": list(self.warnings),
            }

    # -- lifecycle -----------------------------------------------------------------------------
    def close(self, timeout: Optional[float] = None) -> bool:
        """Flush pending writes, stop the writer, release the folder lock. Idempotent."""
        done = self.flush(timeout)
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None and done:
            self._thread.join(timeout=5.0)
        if self._lock_fd is not None and (self._thread is None or not self._thread.is_alive()):
            try:
                os.close(self._lock_fd)  # closing drops the flock
            except OSError:
                pass
            self._lock_fd = None
        return done

    # -- open ----------------------------------------------------------------------------------
    def _default_budget(self) -> int:
        try:
            free = shutil.disk_usage(self.root if self.root.exists() else self.root.parent).free
        except OSError:
            free = 0
        return int(min(DEFAULT_MAX_BUDGET, free * DEFAULT_FREE_FRACTION))

    def _acquire_lock(self) -> bool:
        """One writer per folder: a second app instance reads the cache but never changes it."""
        try:
            import fcntl
        except ImportError:  # no flock (Windows): single instance assumed
            return True
        try:
            fd = os.open(self.root / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
            # A read-only folder can still serve what it holds.
            self.read_only_reason = os.strerror(e.errno)
            self.last_error = str(e)
            self._warn("readonly", f"The prompt cache folder {self.root} is not writable ({os.strerror(e.errno)}); "
                                   "new snapshots are kept in memory only this session.")
            return False
        if not self._try_lock(fd):
            self.read_only_reason = LOCKED
            self._warn("locked", f"The prompt cache in {self.root} is in use by another instance; "
                                 "this one reads it (and takes over writing when that one exits).")
            return False
        return True

    def _try_lock(self, fd: Optional[int] = None) -> bool:
        """Take the folder's flock without waiting (`fd`: the lock file, opened here if None)."""
        import fcntl

        try:
            if fd is None:
                fd = os.open(self.root / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            if fd is not None:
                os.close(fd)
            return False
        self._lock_fd = fd
        return True

    def _open_index(self) -> None:
        """Load and validate the index, then reconcile it with the files (writer not started)."""
        entries, self.rejected, error = read_index(self.index_path, self.snap_dir)
        if error is not None:
            self.last_error = error
        self._dirty = bool(self.rejected or error)
        for e in entries:
            self._index.add(e)
        if self.writable:
            for path, temp in stray_files(self.root, self.snap_dir, self._index, TMP_PREFIX):
                # Temp files are interrupted writes; unlisted snapshot files have no checksum
                # that vouches for their bytes (module doc): both go.
                unlink(path)
                if temp:
                    self.temps_removed += 1
                else:
                    self.orphans_removed += 1
        else:
            self._dirty = False

    # -- reading -------------------------------------------------------------------------------
    def _read(self, entry: Entry) -> Snapshot:
        path = self.snap_dir / f"{entry.meta.id}.safetensors"
        try:
            with open(path, "rb") as f:
                data = f.read(entry.file_bytes + 1)
        except FileNotFoundError:
            raise SnapshotError("file missing") from None
        except OSError as e:
            raise SnapshotError(f"cannot read file: {e.strerror or e}") from None
        return decode_snapshot(data, entry, self.env)
