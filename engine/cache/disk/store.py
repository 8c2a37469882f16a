"""The owner of the disk tier's index: every change to it, and the writes that go with each.

`DiskStore` does the writer thread's tasks (writer.py hands them over one at a time): save a
snapshot (plan its packs, evict to make room, write the packs, commit the manifest, drop what
it makes redundant), delete, clear, mark used, sync the index and apply the budget. It is the
only code that changes the `Index`, and it takes no lock to do so: on a writing instance it runs
on the writer thread only (a reader instance has no writer; its front calls `reload` on the
engine thread, and hands the store to a writer thread when it takes over). Readers see
`view`, an `IndexView` copy published after each change, before any file the change frees is
deleted; replacing the attribute is atomic, so nobody waits for an eviction or a rescan.
"""

from __future__ import annotations

import errno
import time
from dataclasses import replace
from pathlib import Path

from engine.cache.blocks import block_bounds, prefix_meta_fields
from engine.cache.disk.files import unlink
from engine.cache.disk.index import Index, IndexView
from engine.cache.disk.pack import Entry
from engine.cache.disk.packfiles import PackFiles
from engine.cache.disk.plan import incoming_bytes, plan_packs
from engine.cache.disk.report import Report
from engine.cache.disk.writer import WriterThread, WriteTask
from engine.cache.eviction import EvictionPolicy
from engine.cache.meta import SnapshotMeta
from engine.cache.planner import dominates
from engine.cache.snapshot import Snapshot, new_snapshot_id

INDEX_RETRY_S = 5.0  # after a failed index write (disk full), wait this long before retrying


class DiskStore:
    """The index, its one owner, and the writes that change it (see the module doc)."""

    def __init__(self, index: Index, files: PackFiles, budget_bytes: int, policy: EvictionPolicy,
                 report: Report, writer: WriterThread, writable: bool) -> None:
        self.index = index
        self.files = files
        self.budget_bytes = budget_bytes
        self.policy = policy
        self.report = report
        self.writer = writer
        self.writable = writable
        self.dirty = False  # the index on disk is behind the one in memory
        self._retry_at = 0.0
        self.clears = 0  # clears applied (the front hides entries until its own clear is)
        self.view: IndexView = index.view(0)

    def publish(self) -> None:
        self.view = self.index.view(self.clears)

    def replace_index(self, index: Index, dirty: bool) -> None:
        """A freshly read index (opening, a reader's re-read, a takeover)."""
        self.index, self.dirty = index, dirty
        self.publish()

    # -- the writer's tasks --------------------------------------------------------------------
    def do(self, task: WriteTask) -> None:
        """One task of the writer thread; never raises (errors are recorded and told once)."""
        try:
            if not self.writable:
                return  # a read-only folder: drop the work, the memory tier has it all
            if task.kind == "save" and task.snapshot is not None:
                self.save(task.snapshot)
            elif task.kind == "delete":
                for sid in task.ids:
                    self.index.drop(sid)
                self.dirty = True
                self.collect()  # forget first, then delete (see collect)
            elif task.kind == "clear":
                self.clear()
            elif task.kind == "touch":
                for sid in task.ids:
                    e = self.index.get(sid)
                    if e is not None:
                        e.last_used = task.at
                        self.dirty = True
            elif task.kind == "sync":
                self.evict(0)
            if self.dirty and self.writer.queue_empty() and time.monotonic() >= self._retry_at:
                self.write_index()
        except Exception as e:  # never let the writer die: record, tell once, go on
            self.failed(e)
        finally:
            self.publish()

    def _superseded(self, meta: SnapshotMeta) -> bool:
        """True if the disk (or a save queued after this one) already serves every restore it could."""
        other = self.index.dominating(meta)
        if other is not None:
            other.last_used = time.time()
            self.dirty = True
            return True
        return any(m.model_key == meta.model_key and dominates(m, meta)
                   for m in (s.meta for s in self.writer.queued_saves()))

    def save(self, snap: Snapshot) -> None:
        meta = snap.meta
        if self._superseded(meta) or meta.nbytes > self.budget_bytes:
            self.report.count("skipped")  # save_async (the engine thread) counts skips too
            return
        names, rows = plan_packs(snap, self.index.env, self.index.block_locs)
        self.evict(incoming_bytes(snap, rows))
        names, rows = plan_packs(snap, self.index.env, self.index.block_locs)  # again: the eviction may have freed blocks it shared
        t0 = time.perf_counter()
        self.writer.begin_write()
        self.files.hooks.point("begin")
        size = 0
        now = time.time()
        whole = next((r.id for r in rows if r.whole), None)
        entry = Entry(meta, self.index.env, names, whole, now, now)

        def commit() -> None:
            """The manifest commit: list the packs and the manifest, write the index atomically."""
            for row in rows:
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
            for row in rows:
                size += self.files.write(snap, row, written)
            commit()
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
            self.writer.end_write()
        self.report.wrote(meta.kind, meta.length, size, time.perf_counter() - t0)
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
        """Cut back to their last exact cut the "end" snapshots whose tokens `meta` (trimmable)
        extends: past that cut they hold decoded tokens, which `meta` serves as well in fast mode
        and no exact restore can use; up to it (a regenerate's pre-last point) they stay. Their
        tail blocks are then free. How many were cut."""
        if not meta.trimmable:
            return 0
        n_cut = 0
        for e in list(self.index):
            m = e.meta
            n = m.canonical
            if (m.id == meta.id or m.model_key != meta.model_key or m.kind != "end" or not m.trimmable
                    or e.whole is not None or not e.block_names or not 0 < n < m.length
                    or meta.tokens[: m.length] != m.tokens):
                continue
            ends = [b for _, b in block_bounds(m)]
            if n not in ends:
                continue
            cut = replace(m, id=new_snapshot_id(), tokens=m.tokens[:n], kind="pre-last",
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
            self.writer.sync_at(self._retry_at)
            raise
        self._retry_at = 0.0

    def failed(self, e: BaseException) -> None:
        """A write failed: count it, tell once; a folder that cannot be written stops the writes."""
        if self.report.write_failed(e, self.files.root):
            self.writable = False
            self.writer.discard_all()
