"""The disk tier of the prompt cache: snapshots that survive restarts (G2).

Layout under the cache root (``platformdirs.user_cache_dir("Verbatim")/prompt-cache`` or the
``--cache-dir`` given)::

    index.json                 the manifests (each snapshot's SnapshotMeta, the names of its blocks,
                               the pack of its whole pieces) and the pack rows (span, block names,
                               file size, sha256, compute environment)
    snapshots/<id>.safetensors one save's new blocks (positions [start, end) of every layer kept in
                               blocks) and its snapshot's whole pieces (pack.py)
    .lock                      flock held by the one process allowed to write

A snapshot costs what it adds: a save writes only the blocks the disk lacks (engine/cache/
blocks.py names them by their history), in one pack; the budget counts each pack once, however
many snapshots share its blocks; eviction drops least recently used snapshots, and a pack goes
when no snapshot uses it any more.

Invariants, and why they hold:

- A file under its final name is complete: it is written as ``snapshots/.tmp-*``, fsynced, and only
  then renamed. Temp files are never listed and are deleted on open.
- A pack is on disk (fsynced, renamed, folder fsynced) *before* the index that names it is
  written (temp + fsync + rename: atomic). A crash in between leaves an unlisted pack, deleted on
  open. A manifest is valid only if every pack its blocks are in is listed with its file there;
  the reader drops the others. A pack is deleted only after an index that no longer names it is
  on disk, so no manifest on disk ever names a deleted pack.
- ``load()`` reads each pack a snapshot uses once, checks its size, sha256 and header against its
  row, and only then builds cache objects: a flipped, truncated, swapped or missing pack raises
  ``SnapshotError``, and every snapshot using it is removed (exactly those). Nothing partial is
  ever restored. A reader (another instance writes) that finds a pack gone restores the longest
  prefix of blocks still there.
- Only ids accepted by ``format.is_snapshot_id`` ever become paths, so no index content can
  reach outside the root.
- Each pack and manifest records the compute environment (MLX and mlx-lm versions, device, BLAS
  libraries): a state computed by other kernels is not bit-equal to a cold run here (G3), and unlike
  the memory tier the disk outlives an app update or a BLAS change. Entries from another environment
  are kept (within the budget) but never returned; the environment also roots every block name.
- A folder of an older format (format 2: one file a snapshot) is removed at the first open, with
  one log line: nothing is lost but speed.
- All disk I/O (packs, index, deletions) runs on one writer thread; ``save_async`` only appends
  to a queue. Snapshot arrays are already evaluated (the memory tier's packs), so serialising them off
  the engine thread needs no MLX stream (checked: ``mx.save_safetensors`` works there).
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
import logging
import os
import shutil
import threading
import time
import weakref
from collections import deque
from pathlib import Path
from typing import Any, Callable, Optional

from dataclasses import replace

from engine.cache.block_state import SharedSnapshot
from engine.cache.blocks import block_keys, prefix_meta_fields
from engine.cache.disk.files import DamagedFile, read_regular, unlink
from engine.cache.disk.format import FORMAT_VERSION, checked_trimmable, compute_env
from engine.cache.disk.hooks import NO_HOOKS, WriterHooks
from engine.cache.disk.index import PACK_SUFFIX, Index, index_version, read_index, stray_files
from engine.cache.disk.pack import Entry, LoadedPack, PackRow, assemble, decode_pack
from engine.cache.disk.writer import MAX_PENDING_BYTES, TMP_PREFIX, WriterThread, WriteTask
from engine.cache.families import persisted
from engine.cache.planner import SnapshotMeta
from engine.cache.snapshot import Snapshot, new_snapshot_id
from engine.errors import SnapshotError
from engine.paths import prompt_cache_dir

log = logging.getLogger(__name__)

INDEX_NAME = "index.json"
DAMAGED_NAME = "index.json.damaged"  # the last damaged index, kept for a look (one at most)
PACK_DIR = "snapshots"  # format 2 kept one file a snapshot here; format 3 keeps packs
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
        self.pack_dir = self.root / PACK_DIR
        self.index_path = self.root / INDEX_NAME
        self.on_warning = on_warning
        self.max_pending_bytes = max_pending_bytes
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._queue: deque[WriteTask] = deque()
        self._pending_bytes = 0
        self._busy = False
        self._holds = 0  # generations in progress: the writer waits for them (see hold_writes)
        self._write_started: Optional[float] = None
        self.old_format_removed = False
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
                self._remove_old_format()
                self.pack_dir.mkdir(exist_ok=True)
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
                self._remove_old_format()
                self.pack_dir.mkdir(exist_ok=True)
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

    def load(self, meta: SnapshotMeta, upto: Optional[int] = None) -> SharedSnapshot:
        """Read, verify and rebuild a snapshot (on the calling thread, which owns the arrays).

        A pack that fails its checks makes every snapshot using it unusable (removed, and the
        error says which pack). A reader that finds a pack gone (the writer instance evicted it)
        gets the longest prefix of the snapshot whose blocks are still there, if its layers allow
        cutting it; the caller sees a shorter snapshot. `upto`: the caller restores only that
        many tokens; a snapshot that can be cut is then read only up to the first block end at
        or past it (a regenerate does not read the decoded tail), as a shorter snapshot of its own
        id (the one on disk stays whole)."""
        with self._lock:
            entry = self._index.get(meta.id)
            index = self._index
        if entry is None:
            raise SnapshotError("not in the disk index")
        try:
            snap = self._read(entry, index, upto)
        except SnapshotError as e:
            self.load_errors += 1
            self.remove(meta.id)  # gone from the index: the loss is logged (and declined) once
            log.warning("prompt cache %s: snapshot %s unusable: %s", self.root, meta.id, e)
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
            with self._lock:  # the writer counts its own skips too
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

    def _remove_pack_users(self, pack_id: str) -> list[str]:
        """A bad pack: forget every snapshot that uses it (exactly those); their ids."""
        with self._lock:
            users = self._index.users_of_pack(pack_id)
        for sid in users:
            self.remove(sid)
        return users

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
                "bytes": self._index.total_bytes(),  # unique bytes: each pack once
                "packs": len(self._index.packs),
                "blocks": len(self._index.blocks),
                "shared_bytes": max(0, self._index.referenced_block_bytes() - self._index.total_bytes()),
                "format_version": FORMAT_VERSION,
                "old_format_removed": self.old_format_removed,
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

    def _remove_old_format(self) -> None:
        """A folder written by an older format (2: one file a snapshot) is removed, with one line."""
        version = index_version(self.index_path)
        if version is None or version == FORMAT_VERSION:
            return
        if self.pack_dir.is_dir():
            shutil.rmtree(self.pack_dir, ignore_errors=True)
        unlink(self.index_path)
        self.old_format_removed = True
        log.warning("prompt cache %s: removed a cache of format %s (this version writes format %s); "
                    "it is rebuilt as you chat", self.root, version, FORMAT_VERSION)

    def _open_index(self) -> None:
        """Load and validate the index, then reconcile it with the files (writer not started).
        A damaged index (unreadable, a link, a FIFO, a device, over-size, nested too deep) is
        moved aside as `DAMAGED_NAME` by the writer and the folder starts afresh; every loss is
        one warning (logged once) and so reaches the next reply's report."""
        read = read_index(self.index_path, self.pack_dir, self.env)
        index, self.rejected = read.index, read.rejected
        if read.damage is not None:
            self.last_error = f"prompt cache index unreadable, starting empty: {read.damage}"
            self._warn("damaged", self._damaged_message(read.damage))
        if read.lost:
            self._warn("lost", f"The prompt cache in {self.root} lost {len(read.lost)} cached item(s) "
                               f"on open: {'; '.join(read.lost[:5])}{' ...' if len(read.lost) > 5 else ''}. "
                               "Replies are computed afresh for those prompts.")
        self._dirty = bool(self.rejected or read.damage)
        self._index = index
        if self.writable:
            if index.collect():  # packs no snapshot uses (a crash between a delete and its files)
                self._dirty = True
            for path, temp in stray_files(self.root, self.pack_dir, self._index, TMP_PREFIX):
                # Temp files are interrupted writes; unlisted packs were written but never named
                # by a committed manifest (module doc): both go.
                unlink(path)
                if temp:
                    self.temps_removed += 1
                else:
                    self.orphans_removed += 1
        else:
            self._dirty = False

    def _damaged_message(self, why: str) -> str:
        """Move a damaged index aside (the writer only) and say so; a reader leaves it to the writer."""
        aside = self.root / DAMAGED_NAME
        if not self.writable:
            return (f"The prompt cache index in {self.root} is damaged ({why}); this instance serves "
                    "without the snapshots on disk until the writing instance replaces it.")
        try:
            if aside.is_dir() and not aside.is_symlink():
                shutil.rmtree(aside, ignore_errors=True)
            os.replace(self.index_path, aside)  # a link, a FIFO or a device node moves as itself
            kept = f"kept aside as {aside}"
        except OSError as e:
            kept = f"it could not be moved aside ({e.strerror or e})"
        return (f"The prompt cache index {self.index_path} is damaged ({why}); {kept}, and the cache "
                "starts afresh (replies are computed cold until it fills again).")

    # -- reading -------------------------------------------------------------------------------
    def _read_pack(self, row: PackRow) -> LoadedPack:
        path = self.pack_dir / f"{row.id}{PACK_SUFFIX}"
        try:
            # A regular file only, at most one byte past its row's size (more is a mismatch anyway).
            data = read_regular(path, row.file_bytes + 1)
        except FileNotFoundError:
            raise SnapshotError(f"pack {row.id} missing") from None
        except DamagedFile as e:
            self._remove_pack_users(row.id)
            raise SnapshotError(f"pack {row.id}: {e}") from None
        except OSError as e:
            raise SnapshotError(f"pack {row.id}: cannot read: {e.strerror or e}") from None
        try:
            return decode_pack(data, row, self.env)
        except SnapshotError:
            self._remove_pack_users(row.id)
            raise

    def _read(self, entry: Entry, index: Index, upto: Optional[int] = None) -> Snapshot:
        meta = entry.meta
        if entry.env != self.env:
            raise SnapshotError("computed in another environment")
        if entry.blocks and block_keys(meta, self.env) != entry.blocks:
            # Block names hash the tokens, the history and the key: an edited manifest shows.
            raise SnapshotError("the blocks do not match its index entry (tokens, history or key changed)")
        loaded: dict[str, LoadedPack] = {}
        pieces: list[tuple[LoadedPack, int, int]] = []
        gone: Optional[SnapshotError] = None
        short = upto is not None and entry.whole is None and meta.trimmable and upto < meta.length
        for k in entry.blocks:
            loc = index.blocks.get(k)
            if loc is None:
                raise SnapshotError(f"block {k} is not on disk")
            pid, a, b, _ = loc
            if short and upto is not None and a >= upto:
                break  # the rest is past what the caller restores
            if pid not in loaded:
                row = index.packs.get(pid)
                try:
                    if row is None:  # the writer collected it meanwhile
                        raise SnapshotError(f"pack {pid} missing")
                    loaded[pid] = self._read_pack(row)
                except SnapshotError as e:
                    if self.writable or "missing" not in str(e):
                        raise
                    gone = e  # a reader: the writer instance took it away; keep the prefix
                    break
            if pieces and pieces[-1][0] is loaded[pid] and pieces[-1][2] == a:
                pieces[-1] = (loaded[pid], pieces[-1][1], b)  # one slice per pack run
            else:
                pieces.append((loaded[pid], a, b))
        whole = None
        if gone is None and entry.whole is not None:
            row = index.packs.get(entry.whole)
            if row is None:
                raise SnapshotError("its whole-state pack is not on disk")
            whole = loaded.get(row.id) or self._read_pack(row)
        if gone is not None:
            n = pieces[-1][2] if pieces else 0
            if n == 0 or entry.whole is not None or not meta.trimmable:
                raise gone
            meta = replace(meta, tokens=meta.tokens[:n], kind="partial", **prefix_meta_fields(meta, n))
        elif short and pieces and pieces[-1][2] < meta.length:
            n = pieces[-1][2]
            meta = replace(meta, id=new_snapshot_id(), tokens=meta.tokens[:n], kind="partial",
                           nbytes=meta.nbytes * n // meta.length, **prefix_meta_fields(meta, n))
        try:
            snap, nbytes = assemble(meta, pieces, whole, entry.blocks)
        except SnapshotError as e:
            raise SnapshotError(f"cannot rebuild from its blocks: {e}") from None
        if gone is not None:
            meta = replace(meta, nbytes=nbytes)
        elif nbytes != meta.nbytes:
            raise SnapshotError(f"its state holds {nbytes} bytes, its index entry says {meta.nbytes}: "
                                "the file does not match its index entry")
        snap.meta = checked_trimmable(meta, snap.cache)
        snap.source = "disk"
        return snap
