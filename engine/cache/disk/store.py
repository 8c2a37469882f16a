"""The owner of the disk tier's index, and the writer thread that changes it.

`DiskStore` is the only code that changes the `Index` (index.py). On a writing instance it does
so on its own thread (`start`), which takes the tasks the front queued (writer.py's `WriteQueue`)
one at a time and does each: save a snapshot (plan its packs, evict to make room, write the
packs, commit the manifest, drop what it makes redundant), delete, clear, mark used, sync the
index and apply the budget. The store calls the queue (the next task, what is still queued,
the holds a pack write pauses for); the queue never calls the store.

Readers see `view`, an `IndexView` copy published after each change, before any file the change
frees is deleted; replacing the attribute is atomic, so nobody waits for an eviction or a rescan.

Where two threads meet. The store's role is its own: it starts writable or not, a reader becomes
the writer when the other instance exits (`take_over`, on the engine thread, before the writer
thread starts), and a folder that turns out read-only stops the writes (`failed`, on the writer
thread). An instance with no writer thread changes the index on the engine thread: a reader
re-reads it (`replace_index`) and forgets it on a clear (`clear_now`). `_lock` makes each role
change and each replacement of the index, its clear count and its view one step, so that a view
published by the writer thread never mixes an index with the clear count of another; nobody
reads under it (`writable` and `view` are one reference each), and the engine thread takes it
only for those role changes, never while the writer evicts, rescans or writes.
"""

from __future__ import annotations

import errno
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

from engine.cache.blocks import block_bounds, prefix_meta_fields
from engine.cache.disk.files import unlink
from engine.cache.disk.index import Index, IndexView
from engine.cache.disk.pack import Entry, PackRow
from engine.cache.disk.packfiles import PackFiles
from engine.cache.disk.plan import incoming_bytes, plan_packs
from engine.cache.disk.report import Report
from engine.cache.disk.writer import WriteKind, WriteQueue, WriteTask
from engine.cache.eviction import EvictionPolicy
from engine.cache.kinds import SnapshotKind
from engine.cache.meta import SnapshotMeta
from engine.cache.planner import dominates
from engine.cache.snapshot import Snapshot, new_snapshot_id
from engine.threads import lower_thread_priority

INDEX_RETRY_S = 5.0  # after a failed index write (disk full), wait this long before retrying
WRITER_NICE = 19  # the writer thread's priority, the lowest: below the engine worker (5) and the GUI (0)


class DiskStore:
    """The index, its one owner, and the writer thread that changes it (see the module doc)."""

    def __init__(self, index: Index, files: PackFiles, budget_bytes: int, policy: EvictionPolicy,
                 report: Report, queue: WriteQueue, writable: bool) -> None:
        self.index = index
        self.files = files
        self.budget_bytes = budget_bytes
        self.policy = policy
        self.report = report
        self.queue = queue
        self._lock = threading.Lock()  # role changes and index replacements (the module doc)
        self._writable = writable
        self.dirty = False  # the index on disk is behind the one in memory
        self._retry_at = 0.0
        self.clears = 0  # clears applied (the front hides entries until its own clear is)
        self.view: IndexView = index.view(0)
        self.thread: Optional[threading.Thread] = None  # the writer thread, once started

    @property
    def writable(self) -> bool:
        """This instance writes the folder (it holds the folder's lock and the folder takes writes)."""
        return self._writable

    # -- role changes and replacements (the engine thread, where no writer thread changes the index)
    def take_over(self) -> None:
        """A reader becomes the writer: the other instance exited and its folder lock is ours now.
        Before `start`, on the engine thread."""
        with self._lock:
            self._writable = True

    def replace_index(self, index: Index, dirty: bool) -> None:
        """A freshly read index (opening, a reader's re-read, a takeover), before the writer thread
        starts or where there is none."""
        with self._lock:
            self.index, self.dirty = index, dirty
            self.view = index.view(self.clears)

    def clear_now(self, clears: int) -> None:
        """A clear no writer thread will do (a reader, a folder that turned read-only, a stopped
        writer): forget the index in memory, `clears` clears applied. The files are left as they
        are (a reader's belong to the writing instance)."""
        with self._lock:
            self.index, self.dirty, self.clears = Index(self.index.env), False, clears
            self.view = self.index.view(clears)

    def publish(self) -> None:
        with self._lock:
            self.view = self.index.view(self.clears)

    # -- the writer thread ---------------------------------------------------------------------
    def start(self) -> None:
        """Start the writer thread: it does the queue's tasks, one at a time, until the queue stops."""
        thread = threading.Thread(target=self._run, name="verbatim-disk-cache", daemon=True)
        self.queue.taken_by(thread)
        thread.start()
        self.thread = thread

    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def stop(self, join_s: float = 5.0) -> bool:
        """Stop after the task in progress; True if the writer thread has ended (or never ran)."""
        self.queue.stop()
        if self.thread is not None:
            self.thread.join(timeout=join_s)
        return not self.alive()

    def _run(self) -> None:
        # Writes are never urgent; decode is: the writer runs at the lowest priority, so on a
        # machine with few cores it takes only what the engine leaves (docs/benchmarks.md, item 4).
        lower_thread_priority(WRITER_NICE)
        while (task := self.queue.next_task()) is not None:
            try:
                self.do(task)  # never raises: errors are recorded
            finally:
                self.queue.task_done()

    # -- the writer's tasks --------------------------------------------------------------------
    def do(self, task: WriteTask) -> None:
        """One task of the writer thread; never raises (errors are recorded and told once)."""
        try:
            if not self.writable:
                return  # a read-only folder: drop the work, the memory tier has it all
            match task.kind:
                case WriteKind.SAVE:
                    if task.snapshot is not None:
                        self.save(task.snapshot)
                case WriteKind.DELETE:
                    for sid in task.ids:
                        self.index.drop(sid)
                    self.dirty = True
                    self.collect()  # forget first, then delete (see collect)
                case WriteKind.CLEAR:
                    self.clear()
                case WriteKind.TOUCH:
                    for sid in task.ids:
                        if self.index.touch(sid, task.at):
                            self.dirty = True
                case WriteKind.SYNC:
                    self.evict(0)
            if self.dirty and self.queue.queue_empty() and time.monotonic() >= self._retry_at:
                self.write_index()
        except Exception as e:  # never let the writer die: record, tell once, go on
            self.failed(e)
        finally:
            self.publish()

    def _superseded(self, meta: SnapshotMeta) -> bool:
        """True if the disk (or a save queued after this one) already serves every restore it could."""
        other = self.index.dominating(meta)
        if other is not None:
            self.index.touch(other.meta.id, time.time())
            self.dirty = True
            return True
        return any(m.model_key == meta.model_key and dominates(m, meta)
                   for m in (s.meta for s in self.queue.queued_saves()))

    def save(self, snap: Snapshot) -> None:
        meta = snap.meta
        if self._superseded(meta) or meta.nbytes > self.budget_bytes:
            self.report.count("skipped")  # save_async (the engine thread) counts skips too
            return
        names, rows = plan_packs(snap, self.index.env, self.index.block_locs)
        self.evict(incoming_bytes(snap, rows))
        names, rows = plan_packs(snap, self.index.env, self.index.block_locs)  # again: the eviction may have freed blocks it shared
        t0 = time.perf_counter()
        self.queue.begin_write()
        self.files.hooks.point("begin")
        now = time.time()
        whole = next((r.id for r in rows if r.whole), None)
        entry = Entry(meta, self.index.env, names, whole, now, now)

        def commit(packs: list[PackRow]) -> None:
            """The manifest commit: list the packs and the manifest, write the index atomically."""
            for row in packs:
                self.index.add_pack(row)
            added = self.index.add(entry)
            self.dirty = True
            if not added:  # a block it shares went meanwhile (a delete): drop it, nothing is lost
                raise OSError(errno.ENOENT, "a block of the snapshot left the disk while it was saved")
            self.write_index()
            self.files.hooks.point("index_written")

        written: list[Path] = []
        try:
            # The packs are on disk (fsynced, renamed) before the index that names them: a crash
            # in between leaves unlisted packs, deleted on open; never a manifest without its blocks.
            packs = [self.files.write(snap, row, written) for row in rows]
            commit(packs)
        except Exception as e:
            self.index.drop(meta.id)
            listed = set(self.index.packs)
            self.dirty = True
            for path in written:
                if path.name[: -len(".safetensors")] not in listed:
                    unlink(path)
            self.failed(e)
            self._collect_quietly()
            return
        finally:
            self.queue.end_write()
        self.report.wrote(meta.kind, meta.length, sum(r.file_bytes for r in packs), time.perf_counter() - t0)
        # Drop entries the new one makes redundant (same state, or a trimmable superset), and
        # the decoded tails it makes redundant.
        redundant = self.index.redundant(meta)
        for sid in redundant:
            self.index.drop(sid)
        if self.trim_tails(meta) or redundant:
            self.collect()
        self.evict(0)
        self.files.hooks.point("done")

    def trim_tails(self, meta: SnapshotMeta) -> int:
        """Cut back to their last exact cut the end snapshots whose tokens `meta` (trimmable)
        extends: past that cut they hold decoded tokens, which `meta` serves as well in fast mode
        and no exact restore can use; up to it (a regenerate's pre-last point) they stay. Their
        tail blocks are then free. How many were cut."""
        if not meta.trimmable:
            return 0
        n_cut = 0
        for e in list(self.index):
            m = e.meta
            n = m.canonical
            if (m.id == meta.id or m.model_key != meta.model_key or m.kind != SnapshotKind.END or not m.trimmable
                    or e.whole is not None or not e.block_names or not 0 < n < m.length
                    or meta.tokens[: m.length] != m.tokens):
                continue
            ends = [b for _, b in block_bounds(m)]
            if n not in ends:
                continue
            cut = replace(m, id=new_snapshot_id(), tokens=m.tokens[:n], kind=SnapshotKind.PRE_LAST,
                          nbytes=m.nbytes * n // m.length, **prefix_meta_fields(m, n))
            self.index.drop(m.id)
            if self.index.add(Entry(cut, e.env, e.block_names[: ends.index(n) + 1], None, e.created, e.last_used)):
                n_cut += 1
        return n_cut

    def collect(self) -> None:
        """Forget the packs no manifest uses, write the index, then delete their files: a crash in
        between leaves unlisted files (removed on open), never a manifest whose blocks are gone."""
        gone = self.index.collect()
        self.dirty = True
        self.write_index()
        self.files.delete(gone)

    def _collect_quietly(self) -> None:
        try:
            self.collect()
        except Exception:
            pass  # already recorded; the next index write retries

    def evict(self, incoming: int) -> None:
        """Drop snapshots (any model; the policy's order) until `incoming` more bytes fit."""
        victims = self.index.victims(self.budget_bytes, incoming, self.policy)
        self.report.count("evictions", len(victims))
        if victims or self.index.unused_packs():
            self.collect()

    def clear(self) -> None:
        self.index.clear()
        with self._lock:
            self.clears += 1
        self.dirty = True
        self.write_index()
        self.files.delete_all()

    def write_index(self) -> None:
        """Atomically replace index.json with the index; readers see the new view first (so no
        reader is sent to a file deleted after this)."""
        blob = self.index.to_json()
        self.dirty = False
        self.publish()
        try:
            self.files.write_index(blob)
        except BaseException:
            self.dirty = True
            self._retry_at = time.monotonic() + INDEX_RETRY_S  # no busy loop on a full disk
            self.queue.sync_at(self._retry_at)
            raise
        self._retry_at = 0.0

    def failed(self, e: BaseException) -> None:
        """A write failed: count it, tell once; a folder that cannot be written stops the writes."""
        if self.report.write_failed(e, self.files.root):
            with self._lock:
                self._writable = False
            self.queue.discard_all()
