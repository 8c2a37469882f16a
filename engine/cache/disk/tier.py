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
blocks.py names them by their history), in at most two packs (blocks.py's `pack_groups`); the
budget counts each pack once, however many snapshots share its blocks; eviction drops snapshots
in the `EvictionPolicy`'s order (engine/cache/eviction.py; least recently used by default), and
a pack goes when no snapshot uses it any more.

Invariants, and why they hold:

- A file under its final name is complete: it is written as ``snapshots/.tmp-*``, fsynced, and only
  then renamed (packfiles.py). Temp files are never listed and are deleted on open.
- A pack is on disk (fsynced, renamed, folder fsynced) *before* the index that names it is
  written (temp + fsync + rename: atomic). A crash in between leaves an unlisted pack, deleted on
  open. A manifest is valid only if every pack its blocks are in is listed with its file there;
  the reader drops the others. A pack is deleted only after an index that no longer names it is
  on disk, so no manifest on disk ever names a deleted pack (store.py).
- ``load()`` reads each pack a snapshot uses once, checks its size, sha256 and header against its
  row, and only then builds cache objects (reader.py): a flipped, truncated, swapped or missing
  pack raises ``SnapshotError``, and every snapshot using it is removed (exactly those). Nothing
  partial is ever restored. A reader (another instance writes) that finds a pack gone
  (``packfiles.PackMissing``, never a pack that is there and fails its checks) restores the
  longest prefix of blocks still there.
- Only ids accepted by ``format.is_snapshot_id`` ever become paths, so no index content can
  reach outside the root.
- Each pack and manifest records the compute environment (engine/cache/env.py): a state computed
  by other kernels is not bit-equal to a cold run here (G3), and unlike the memory tier the disk
  outlives an app update or a BLAS change. Entries from another environment are kept (within the
  budget) but never returned; the environment also roots every block name.
- A folder of an older format (format 2: one file a snapshot) is removed at the first open, with
  one log line: nothing is lost but speed.
- Threads. Every write (packs, index, deletions after an eviction) runs on one writer thread,
  the store's (store.py), which alone changes the index; ``save_async``, ``remove``, ``clear``
  and a load's "used now" only queue a task (writer.py). The engine thread reads: ``entries()``
  and ``load()`` use the index view the writer last published, and ``load()`` reads and checks
  pack files on the engine thread (it owns the arrays it builds). A reader instance has no
  writer thread: its store re-reads the index and forgets it on a clear, and deletes stray files
  when it takes over, on the engine thread. No lock the engine thread takes is ever held while
  the writer evicts, rescans, serializes or writes (the store's own lock only makes a role
  change or an index replacement one step: store.py). MLX on the writer thread: a pack write
  slices the snapshot's arrays (lazy views, made on the writer thread, so on its own stream) and
  ``mx.save_safetensors`` evaluates those slices there. The arrays sliced are already evaluated
  (the memory tier's packs and whole clones: ``MemoryTier.add`` evaluates them) and nothing
  writes into them again, so no graph built on the engine thread is ever evaluated on the writer
  thread (MLX refuses that: "There is no Stream(cpu, 0) in current thread") and the engine
  thread's arrays never change under it.
- I/O errors (disk full, read-only dir) never reach the generation: they are counted, the first
  one becomes a user-facing warning (report.py), and the memory tier keeps working.

The package, one idea a module: tier.py (this front, what the prompt cache calls), folder.py
(opening a folder), index.py (the index and its views: pure data), store.py (the index's owner
and its writer thread), plan.py (what a save writes), writer.py (the writer's queue and holds),
packfiles.py (the files), reader.py (reading a snapshot back), pack.py and format.py (the file
format), files.py (file primitives), report.py (counters, warnings), hooks.py (observation
points). Each field is written by its own class (tests/cache/test_disk_ownership.py checks it).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Optional

from engine.cache.block_state import SharedSnapshot
from engine.cache.disk import folder
from engine.cache.disk.format import FORMAT_VERSION
from engine.cache.disk.hooks import NO_HOOKS, WriterHooks
from engine.cache.disk.index import Index, IndexView
from engine.cache.disk.packfiles import TMP_PREFIX, PackFiles
from engine.cache.disk.reader import read_snapshot
from engine.cache.disk.report import Report
from engine.cache.disk.store import DiskStore
from engine.cache.disk.writer import MAX_PENDING_BYTES, WriteKind, WriteQueue, WriteTask
from engine.cache.env import compute_env
from engine.cache.eviction import KEEP_DOCUMENTS, EvictionPolicy
from engine.cache.families import persisted
from engine.cache.kinds import SnapshotKind
from engine.cache.meta import SnapshotMeta
from engine.cache.snapshot import Snapshot
from engine.errors import SnapshotError
from engine.paths import prompt_cache_dir

log = logging.getLogger(__name__)

INDEX_NAME = "index.json"
PACK_DIR = "snapshots"  # format 2 kept one file a snapshot here; format 3 keeps packs
LOCKED = "another Verbatim instance is using this prompt cache"
READER_POLL_S = 1.0  # a reader (another instance writes) looks at the index and the lock this often


class DiskCache:
    """The persistent tier behind `PromptCache` (satisfies `prompt_cache.DiskTier`).

    The front: it queues the writer's work and reads the index view the writer publishes, so
    `entries()` never touches the disk and never waits for the writer. It changes nothing of
    the store, the queue or the report but through their methods. Only the engine thread calls
    `load()`."""

    def __init__(
        self,
        root: Optional[Path | str] = None,
        budget_bytes: Optional[int] = None,
        on_warning: Optional[Callable[[str], None]] = None,
        max_pending_bytes: int = MAX_PENDING_BYTES,
        hooks: WriterHooks = NO_HOOKS,
        policy: EvictionPolicy = KEEP_DOCUMENTS,
    ) -> None:
        self.root = Path(root).expanduser() if root is not None else prompt_cache_dir()
        self.pack_dir = self.root / PACK_DIR
        self.index_path = self.root / INDEX_NAME
        self.env = compute_env()
        self.report = Report(on_warning)
        self.queue = WriteQueue(hooks, max_pending_bytes)
        self.files = PackFiles(self.root, self.pack_dir, self.index_path, hooks, self.queue.wait_while_held)
        self.old_format_removed = False
        self.read_only_reason: Optional[str] = None
        self.took_over = False  # a reader that became the writer when the other instance exited
        self._lock_fd: Optional[int] = None
        self._poll_lock = threading.Lock()  # a reader's poll (the engine thread's, and stats')
        self._index_stamp: Optional[tuple[int, int, int]] = None  # what a reader last read
        self._next_poll = 0.0
        self._forgotten: set[str] = set()  # removed here, maybe not yet by the writer
        self._clears = 0  # clears asked for (the view hides entries until the writer applied them)
        writable, enabled = False, False
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            writable = self._acquire_lock()
            if writable:
                self._take_folder()
            enabled = True
        except OSError as e:
            writable = False
            self.report.warn("open", f"Prompt cache folder {self.root} is not usable ({e.strerror or e}); "
                                     "the cache works in memory only this session.")
            self.report.error(str(e))
        self.enabled = enabled
        if budget_bytes is None:
            budget_bytes = folder.default_budget(self.root)
        self.store = DiskStore(Index(self.env), self.files, int(budget_bytes), policy, self.report,
                               self.queue, writable)
        if self.enabled:
            self._index_stamp = self._stamp()
            self._open_index()
        if writable:
            self._start_writer()

    @property
    def hooks(self) -> WriterHooks:
        return self.files.hooks

    @hooks.setter
    def hooks(self, hooks: WriterHooks) -> None:
        self.files.use_hooks(hooks)
        self.queue.use_hooks(hooks)

    @property
    def writable(self) -> bool:
        return self.store.writable

    @property
    def budget_bytes(self) -> int:
        return self.store.budget_bytes

    @property
    def on_warning(self) -> Optional[Callable[[str], None]]:
        return self.report.on_warning

    @on_warning.setter
    def on_warning(self, fn: Optional[Callable[[str], None]]) -> None:
        self.report.listen(fn)

    @property
    def write_log(self) -> list[tuple[SnapshotKind, int, int, float]]:
        return list(self.report.write_log)

    @property
    def warnings(self) -> list[str]:
        return list(self.report.warnings)

    @property
    def last_error(self) -> Optional[str]:
        return self.report.last_error

    @property
    def index_reloads(self) -> int:
        return self.report.counters()["index_reloads"]

    def _start_writer(self) -> None:
        self.queue.submit(WriteTask(WriteKind.SYNC))  # apply the budget (it may have shrunk) off this thread
        self.store.start()
        # Best effort on exit without close(): pending writes get a short grace period.
        ref = weakref.ref(self)
        atexit.register(lambda: (c := ref()) is not None and c.close(timeout=10.0))

    # -- DiskTier protocol: reading --------------------------------------------------------------
    def _view(self) -> IndexView:
        view = self.store.view
        return view if view.clears >= self._clears else IndexView.empty(self.env, self._clears)

    def entries(self, model_key: str) -> list[SnapshotMeta]:
        self.poll()
        forgotten = self._forgotten
        return [m for m in self._view().metas(model_key) if m.id not in forgotten]

    def model_keys(self) -> list[str]:
        """Every lookup key (a model's, or one of its namespaces': engine/cache/namespace.py) the
        disk holds snapshots of."""
        self.poll()
        return self._view().model_keys()

    def last_used(self, snapshot_id: str) -> float:
        """When the snapshot was last written or read (0.0: not in the index)."""
        entry = self._view().get(snapshot_id)
        return entry.last_used if entry is not None else 0.0

    def load(self, meta: SnapshotMeta, upto: Optional[int] = None) -> SharedSnapshot:
        """Read, verify and rebuild a snapshot (on the calling thread, which owns the arrays).

        A pack that fails its checks makes every snapshot using it unusable (removed, and the
        error says which pack). A reader that finds a pack gone (the writer instance evicted it)
        gets the longest prefix of the snapshot whose blocks are still there, if its layers allow
        cutting it; the caller sees a shorter snapshot. `upto`: the caller restores only that
        many tokens; a snapshot that can be cut is then read only up to the first block end at
        or past it (a regenerate does not read the decoded tail), as a shorter snapshot of its own
        id (the one on disk stays whole)."""
        view = self._view()
        entry = view.get(meta.id) if meta.id not in self._forgotten else None
        if entry is None:
            raise SnapshotError("not in the disk index")
        try:
            snap = read_snapshot(entry, view, self.files, self.writable,
                                 lambda pid: self._remove_pack_users(view, pid), upto)
        except SnapshotError as e:
            self.report.count("load_errors")
            self.remove(meta.id)  # gone from the index: the loss is logged (and declined) once
            log.warning("prompt cache %s: snapshot %s unusable: %s", self.root, meta.id, e)
            raise e
        if self.writable:
            self.queue.submit(WriteTask(WriteKind.TOUCH, ids=[meta.id], at=time.time()))
        self.report.count("loads")
        return snap  # type: ignore[return-value]

    # -- DiskTier protocol: changes (queued for the writer) ----------------------------------------
    def save_async(self, snapshot: Snapshot) -> None:
        """Queue a snapshot for writing; returns at once (no disk I/O on the caller's thread)."""
        if not self.writable:
            return
        if not all(persisted(c) for c in snapshot.meta.classes):
            self.report.count("skipped")  # the writer counts its own skips too
            return
        self._forgotten.discard(snapshot.meta.id)
        dropped = self.queue.submit_save(snapshot)
        if dropped:
            self.report.count("dropped", dropped)

    def remove(self, snapshot_id: str) -> None:
        self._forgotten.add(snapshot_id)
        if self.writable:
            self.queue.submit(WriteTask(WriteKind.DELETE, ids=[snapshot_id]))

    def _remove_pack_users(self, view: IndexView, pack_id: str) -> list[str]:
        """A bad pack: forget every snapshot that uses it (exactly those); their ids."""
        users = view.users_of_pack(pack_id)
        for sid in users:
            self.remove(sid)
        return users

    def clear(self) -> None:
        self._clears += 1
        self._forgotten.clear()
        if self.writable and self.queue.submit(WriteTask(WriteKind.CLEAR)):
            return
        self.store.clear_now(self._clears)  # no writer thread will: the store forgets it here

    # -- DiskTier protocol: the writer's schedule, reports, lifecycle ------------------------------
    def hold_writes(self) -> None:
        self.queue.hold_writes()

    def release_writes(self) -> None:
        self.queue.release_writes()

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until every queued write is on disk; False if `timeout` ran out first."""
        return self.queue.flush(timeout)

    def pop_warnings(self) -> list[str]:
        """Warnings not yet shown to the user (each problem is reported once)."""
        return self.report.pop_warnings()

    def stats(self) -> dict[str, Any]:
        view = self._view()
        total = view.total_bytes()
        return {
            "dir": str(self.root),
            "env": self.env,
            "entries": sum(1 for e in view if e.meta.id not in self._forgotten),
            "entries_other_env": view.other_env(),
            "bytes": total,  # unique bytes: each pack once
            "packs": len(view.packs),
            "blocks": len(view.block_locs),
            "shared_bytes": max(0, view.referenced_block_bytes() - total),
            "format_version": FORMAT_VERSION,
            "old_format_removed": self.old_format_removed,
            "budget_bytes": self.budget_bytes,
            "writable": self.writable,
            "pending": self.queue.pending(),
            **self.report.stats(),
        }

    def close(self, timeout: Optional[float] = None) -> bool:
        """Flush pending writes, stop the writer, release the folder lock. Idempotent."""
        done = self.flush(timeout)
        ended = self.store.stop(5.0 if done else 0.0)
        if self._lock_fd is not None and self._lock_fd >= 0 and ended:
            try:
                os.close(self._lock_fd)  # closing drops the flock
            except OSError:
                pass
            self._lock_fd = None
        return done

    # -- a reader: another instance writes -------------------------------------------------------
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
        with self._poll_lock:
            if self.store.thread is not None or (not force and now < self._next_poll):
                return
            self._next_poll = now + READER_POLL_S
            fd = folder.try_lock(self.root)
            if fd is not None:
                self._lock_fd = fd
                self.took_over, self.read_only_reason = True, None
                self.store.take_over()
                self._take_folder()
                self._open_index()
                self._start_writer()
                return
            stamp = self._stamp()
            if stamp != self._index_stamp:
                self._index_stamp = stamp
                self._open_index()
                self.report.count("index_reloads")

    # -- open --------------------------------------------------------------------------------------
    def _acquire_lock(self) -> bool:
        """One writer per folder: a second app instance reads the cache but never changes it."""
        try:
            fd = folder.open_lock(self.root)
        except folder.ReadOnly as e:
            self.read_only_reason = os.strerror(e.errno)
            self.report.error(str(e.error))
            self.report.warn("readonly", f"The prompt cache folder {self.root} is not writable "
                                         f"({os.strerror(e.errno)}); new snapshots are kept in memory only this session.")
            return False
        if fd is None:
            self.read_only_reason = LOCKED
            self.report.warn("locked", f"The prompt cache in {self.root} is in use by another instance; "
                                       "this one reads it (and takes over writing when that one exits).")
            return False
        self._lock_fd = fd
        return True

    def _take_folder(self) -> None:
        """This instance writes: an older format goes, the pack folder exists."""
        if folder.remove_old_format(self.index_path, self.pack_dir):
            self.old_format_removed = True
        self.pack_dir.mkdir(exist_ok=True)

    def _open_index(self) -> None:
        """Load and validate the index, then reconcile it with the files (writer not started).
        A damaged index (unreadable, a link, a FIFO, a device, over-size, nested too deep) is
        moved aside as `folder.DAMAGED_NAME` by the writer and the folder starts afresh; every
        loss is one warning (logged once) and so reaches the next reply's report."""
        writable = self.writable
        read = folder.read_index(self.index_path, self.pack_dir, self.env)
        index = read.index
        self.report.opened(read.rejected)
        if read.damage is not None:
            self.report.error(f"prompt cache index unreadable, starting empty: {read.damage}")
            if writable:
                kept = folder.move_damaged_aside(self.root, self.index_path)
                self.report.warn("damaged", f"The prompt cache index {self.index_path} is damaged ({read.damage}); "
                                            f"{kept}, and the cache starts afresh (replies are computed cold "
                                            "until it fills again).")
            else:
                self.report.warn("damaged", f"The prompt cache index in {self.root} is damaged ({read.damage}); "
                                            "this instance serves without the snapshots on disk until the "
                                            "writing instance replaces it.")
        if read.lost:
            self.report.warn("lost", f"The prompt cache in {self.root} lost {len(read.lost)} cached item(s) "
                                     f"on open: {'; '.join(read.lost[:5])}{' ...' if len(read.lost) > 5 else ''}. "
                                     "Replies are computed afresh for those prompts.")
        dirty = bool(read.rejected or read.damage)
        if writable:
            # Packs no snapshot uses, temp files (interrupted writes) and unlisted packs (written
            # but never named by a committed manifest: module doc) go.
            changed, temps, orphans = folder.tidy(self.root, self.pack_dir, index, TMP_PREFIX)
            dirty = dirty or changed
            self.report.count("temps_removed", temps)
            self.report.count("orphans_removed", orphans)
        else:
            dirty = False
        self._forgotten.clear()
        self.store.replace_index(index, dirty)
