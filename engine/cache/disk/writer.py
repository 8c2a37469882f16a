"""The disk tier's writer thread: every disk write of a `DiskCache` (engine/cache/disk/tier.py).

One thread at the lowest priority takes tasks from a queue: save a snapshot (temp file,
fsync, index, rename: the write order in tier.py's module doc), delete entries, clear, or
sync the index and apply the budget. A generation holds writes (`hold_writes`) so that none
competes with prefill and decode for the CPU; `flush` waits until the queue is empty. I/O
errors are recorded and become one user-facing warning each (`pop_warnings`), never an
exception on the engine's thread.

`WriterThread` is the part of `DiskCache` that does this; `DiskCache.__init__` sets the state
it shares with the rest of the class (the lock and its condition, the index, the counters).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

import mlx.core as mx

from engine.cache.blocks import block_bounds, block_keys, prefix_meta_fields
from engine.cache.disk.files import HashingWriter, file_sha256, fsync, fsync_dir, unlink
from engine.cache.disk.hooks import WriterHooks
from engine.cache.disk.index import PACK_SUFFIX, Index
from engine.cache.disk.pack import Entry, PackRow, encode_pack
from engine.cache.planner import SnapshotMeta, dominates
from engine.cache.snapshot import Snapshot, cache_nbytes, new_snapshot_id
from engine.threads import lower_thread_priority

log = logging.getLogger(__name__)

WRITER_NICE = 19  # the lowest priority: below the engine worker (5) and the GUI (0)
TMP_PREFIX = ".tmp-"
MAX_PENDING_BYTES = 1 << 30  # snapshots queued for writing; beyond this the oldest are dropped
INDEX_RETRY_S = 5.0  # after a failed index write (disk full), wait this long before retrying
# A generation holds writes, but never for longer than this per queued write: a server that
# generates back to back still gets a finished reply's blocks on disk within seconds (the writer
# runs at the lowest priority; docs/benchmarks.md measures what that costs a decode step).
MAX_HOLD_S = 2.0


@dataclass
class WriteTask:
    """One piece of work for the writer thread."""

    kind: str  # "save" | "delete" | "clear" | "sync"
    snapshot: Optional[Snapshot] = None
    ids: list[str] = field(default_factory=list)
    nbytes: int = 0
    queued: float = field(default_factory=time.monotonic)


def incoming_bytes(snap: Snapshot, rows: list[PackRow]) -> int:
    """What the packs `rows` will add to the folder: their blocks, and the whole layers if one of
    them holds the snapshot's whole pieces (eviction makes room for both before the write)."""
    blocks = sum(nb for r in rows for _, _, nb in r.blocks)
    if not any(r.whole for r in rows):
        return blocks
    return blocks + cache_nbytes([c for c, b in zip(snap.cache, snap.layers_in_blocks()) if not b])


def _split(group: list, at: set[int]) -> list[list]:
    """`group` ((start, end), name) in order, cut before each block that starts at a position in `at`."""
    out: list[list] = []
    for x in group:
        if not out or x[0][0] in at:
            out.append([])
        out[-1].append(x)
    return out


class WriterThread:
    """The writer thread of a `DiskCache` and what it writes (see the module doc)."""

    # Set by DiskCache.__init__; `_lock` guards everything below it.
    root: Path
    pack_dir: Path
    index_path: Path
    env: str
    hooks: WriterHooks
    on_warning: Optional[Callable[[str], None]]
    _lock: threading.RLock
    _cond: threading.Condition
    _thread: Optional[threading.Thread]
    _queue: deque[WriteTask]
    _pending_bytes: int
    _busy: bool  # a task is being done
    _holds: int  # generations in progress: the writer waits for them (see hold_writes)
    _write_started: Optional[float]  # monotonic time the current save began (bounds its pauses)
    _flushers: int  # callers in flush(): a hold must not make them wait for ever
    _stop: bool
    _dirty: bool  # the index on disk is behind the one in memory
    _retry_at: float
    _index: Index
    budget_bytes: int
    writable: bool
    writes: int
    write_errors: int
    write_seconds: float
    bytes_written: int
    evictions: int
    skipped: int
    write_log: list[tuple[str, int, int, float]]  # (kind, tokens, bytes, seconds) of the last writes
    last_error: Optional[str]
    warnings: list[str]
    _warned: set[str]
    _unseen: int

    # -- the queue and the holds ---------------------------------------------------------------
    def _settled(self) -> bool:
        """Nothing left for the writer (an index write that keeps failing counts as settled)."""
        index_due = self._dirty and self.writable and time.monotonic() >= self._retry_at
        return not self._queue and not self._busy and not index_due

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until every queued write is on disk; False if `timeout` ran out first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._flushers += 1
            self._cond.notify_all()
            try:
                while not self._settled():
                    if self._thread is None or not self._thread.is_alive():
                        return False
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._cond.wait(0.5 if left is None else min(left, 0.5))
            finally:
                self._flushers -= 1
        return True

    def hold_writes(self) -> None:
        """A generation starts: queued writes wait until `release_writes` (a write already in
        progress pauses between arrays). Disk writes then never compete with prefill and decode
        for the CPU (docs/benchmarks.md, item 4, has the measurement)."""
        with self._cond:
            self._holds += 1

    def _held(self, since: Optional[float]) -> bool:
        """Must the writer wait for a generation? Not past MAX_HOLD_S after `since` (when the
        oldest write was queued, or the current one started), nor while someone flushes."""
        if self._holds <= 0 or self._flushers or self._stop:
            return False
        return since is None or time.monotonic() - since < MAX_HOLD_S

    def _wait_while_held(self) -> None:
        """Called by the writer between pieces of a write: a generation that started meanwhile
        gets the CPU (and the GIL) back at once; the temp file simply waits to be finished
        (at most MAX_HOLD_S from the start of this write)."""
        with self._cond:
            since = self._write_started
            if self._held(since):
                self.hooks.point("paused")
            while self._held(since):
                self._cond.wait(0.1)

    def release_writes(self) -> None:
        with self._cond:
            self._holds = max(0, self._holds - 1)
            self._cond.notify_all()

    # -- the thread ----------------------------------------------------------------------------
    def _next_task(self) -> Optional[WriteTask]:
        with self._cond:
            while True:
                held = self._held(self._queue[0].queued if self._queue else None)
                if self._queue and not held:
                    task = self._queue.popleft()
                    if task.kind == "save":
                        self._pending_bytes -= task.nbytes
                    break
                index_due = self._dirty and self.writable and not held
                if index_due and time.monotonic() >= self._retry_at:
                    task = WriteTask("sync")
                    break
                if self._stop:
                    return None
                if held and self._queue:
                    self.hooks.point("held")
                    self._cond.wait(0.1)  # the hold has a time limit: look again soon
                    continue
                self._cond.wait(max(0.05, self._retry_at - time.monotonic()) if index_due else None)
            self._busy = True
            return task

    def _run(self) -> None:
        # Writes are never urgent; decode is: the writer runs at the lowest priority, so on a
        # machine with few cores it takes only what the engine leaves (docs/benchmarks.md, item 4).
        lower_thread_priority(WRITER_NICE)
        while (task := self._next_task()) is not None:
            try:
                if not self.writable:
                    continue  # a read-only folder: drop the work, the memory tier has it all
                if task.kind == "save" and task.snapshot is not None:
                    self._save(task.snapshot)
                elif task.kind == "delete":
                    self._mark_dirty()
                    self._collect()  # forget first, then delete (see _evict)
                elif task.kind == "clear":
                    self._clear_files()
                elif task.kind == "sync":
                    self._evict(0)
                with self._lock:
                    write_index = self._dirty and not self._queue and time.monotonic() >= self._retry_at
                if write_index:
                    self._write_index()
            except Exception as e:  # never let the writer die: record, tell once, go on
                self._record_error(e)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _mark_dirty(self) -> None:
        with self._lock:
            self._dirty = True

    def _superseded(self, meta: SnapshotMeta) -> bool:
        """True if the disk (or a save queued after this one) already serves every restore it could."""
        with self._lock:
            other = self._index.dominating(meta)
            if other is not None:
                other.last_used = time.time()
                self._dirty = True
                return True
            for t in self._queue:
                if t.kind == "save" and t.snapshot is not None:
                    m = t.snapshot.meta
                    if m.model_key == meta.model_key and dominates(m, meta):
                        return True
        return False

    def _plan_packs(self, snap: Snapshot) -> tuple[list[str], list[PackRow]]:
        """(the names of the snapshot's blocks, the rows of the packs to write: the blocks the disk
        lacks, from the first missing one to the end, and its whole pieces; none: nothing new).

        The new blocks go in at most two packs: those up to the snapshot's last exact cut (the
        prefill, which later turns share) and those after it (decoded tokens), which a later
        snapshot of the same conversation makes redundant (`_trim_tails` frees them)."""
        meta = snap.meta
        blocked = snap.layers_in_blocks()
        names = block_keys(meta, self.env) if any(blocked) else []
        bounds = block_bounds(meta) if names else []
        with self._lock:
            have = 0
            while have < len(names) and names[have] in self._index.blocks:
                have += 1
        new = list(zip(bounds[have:], names[have:]))
        whole = meta.id if not all(blocked) else None
        per_pos = snap.position_bytes()
        groups = [[x for x in new if x[0][1] <= meta.canonical], [x for x in new if x[0][1] > meta.canonical]]
        runs = set(snap.run_ends())  # a pack never crosses a change of the snapshot's buffers
        groups = [g for group in groups for g in _split(group, runs)]
        rows = []
        for group in groups:
            if group:
                rows.append(PackRow(new_snapshot_id(), self.env, meta.model_key, group[0][0][0], group[-1][0][1],
                                    [(b, k, (b - a) * per_pos) for (a, b), k in group], None, 0, ""))
        if whole is not None:
            if rows:
                rows[-1].whole = whole
            else:
                rows.append(PackRow(new_snapshot_id(), self.env, meta.model_key, meta.length, meta.length, [],
                                    whole, 0, ""))
        return names, rows

    def _save(self, snap: Snapshot) -> None:
        meta = snap.meta
        if self._superseded(meta) or meta.nbytes > self.budget_bytes:
            with self._lock:  # save_async (the engine thread) counts skips too
                self.skipped += 1
            return
        names, rows = self._plan_packs(snap)
        self._evict(incoming_bytes(snap, rows))
        names, rows = self._plan_packs(snap)  # again: the eviction may have freed blocks it shared
        t0 = time.perf_counter()
        self._write_started = time.monotonic()
        self.hooks.point("begin")
        size = 0
        now = time.time()
        whole = next((r.id for r in rows if r.whole), None)
        entry = Entry(meta, self.env, names, whole, now, now)

        def commit() -> None:
            """The manifest commit: list the packs and the manifest, write the index atomically."""
            with self._lock:
                for row in rows:
                    self._index.add_pack(row)
                added = self._index.add(entry)
                self._dirty = True
            if not added:  # a block it shares went meanwhile (a delete): drop it, nothing is lost
                raise OSError(errno.ENOENT, "a block of the snapshot left the disk while it was saved")
            self._write_index()
            self.hooks.point("index_written")

        written: list[Path] = []
        try:
            # The packs are on disk (fsynced, renamed) before the index that names them: a crash
            # in between leaves unlisted packs, deleted on open; never a manifest without its blocks.
            for row in rows:
                size += self._write_pack(snap, row, written)
            commit()
        except Exception as e:
            with self._lock:
                self._index.drop(meta.id)
                listed = set(self._index.packs)
                self._dirty = True
            for path in written:
                if path.name[: -len(PACK_SUFFIX)] not in listed:
                    unlink(path)
            self._record_error(e)
            self._collect_quietly()
            return
        finally:
            self._write_started = None
        dt = time.perf_counter() - t0
        with self._lock:
            self.writes += 1
            self.write_seconds += dt
            self.bytes_written += size
            self.write_log.append((meta.kind, meta.length, size, dt))
            del self.write_log[:-64]
            # Drop entries the new one makes redundant (same state, or a trimmable superset), and
            # the decoded tails it makes redundant.
            redundant = self._index.redundant(meta)
            for sid in redundant:
                self._index.drop(sid)
            trimmed = self._trim_tails(meta)
        if redundant or trimmed:
            self._collect()
        self._evict(0)
        self.hooks.point("done")

    def _trim_tails(self, meta: SnapshotMeta) -> int:
        """Cut back to their last exact cut the "end" snapshots whose tokens `meta` (trimmable)
        extends: past that cut they hold decoded tokens, which `meta` serves as well in fast mode
        and no exact restore can use; up to it (a regenerate's pre-last point) they stay. Their
        tail blocks are then free. Called with the lock held; how many were cut."""
        if not meta.trimmable:
            return 0
        n_cut = 0
        for e in list(self._index):
            m = e.meta
            n = m.canonical
            if (m.id == meta.id or m.model_key != meta.model_key or m.kind != "end" or not m.trimmable
                    or e.whole is not None or not e.blocks or not 0 < n < m.length
                    or meta.tokens[: m.length] != m.tokens):
                continue
            ends = [b for _, b in block_bounds(m)]
            if n not in ends:
                continue
            cut = replace(m, id=new_snapshot_id(), tokens=m.tokens[:n], kind="pre-last",
                          nbytes=m.nbytes * n // m.length, **prefix_meta_fields(m, n))
            self._index.drop(m.id)
            if self._index.add(Entry(cut, e.env, e.blocks[: ends.index(n) + 1], None, e.created, e.last_used)):
                n_cut += 1
        return n_cut

    def _write_pack(self, snap: Snapshot, row: PackRow, written: list[Path]) -> int:
        """Write the pack `row` describes (temp file, fsync, rename, fsync the folder); its size.
        Fills in the row's size and checksum; appends the file to `written` once renamed."""
        tensors, header_meta = encode_pack(snap, row)
        final = self.pack_dir / f"{row.id}{PACK_SUFFIX}"
        tmp = self.pack_dir / f"{TMP_PREFIX}{row.id}-{os.getpid()}{PACK_SUFFIX}"
        writer: Optional[HashingWriter] = None
        try:
            with open(tmp, "wb") as f:

                def on_write(n: int) -> None:
                    if n == 2:  # header written, data not yet: a partial file
                        if self.hooks.partial_file:
                            f.flush()
                        self.hooks.point("temp_partial")
                    self._wait_while_held()  # MLX writes one array per call: pause between them

                writer = HashingWriter(f, on_write)
                mx.save_safetensors(writer, tensors, metadata=header_meta)
                f.flush()
                self._wait_while_held()
                fsync(f.fileno())
                size = f.tell()
            row.sha256 = writer.hash.hexdigest() if writer.linear and writer.pos == size else file_sha256(tmp)
            row.file_bytes = size
            self.hooks.point("temp_synced")
            os.replace(tmp, final)
            written.append(final)
            fsync_dir(self.pack_dir)
            self.hooks.point("renamed")
        except Exception as e:
            unlink(tmp)
            if writer is not None and writer.error is not None and not isinstance(e, OSError):
                raise writer.error from None  # the errno MLX wrapped away
            raise
        return size

    def _collect(self) -> None:
        """Forget the packs no manifest uses, write the index, then delete their files: a crash in
        between leaves unlisted files (removed on open), never a manifest whose blocks are gone."""
        with self._lock:
            gone = self._index.collect()
            self._dirty = True
        self._write_index()
        for pid in gone:
            unlink(self.pack_dir / f"{pid}{PACK_SUFFIX}")

    def _collect_quietly(self) -> None:
        try:
            self._collect()
        except Exception:
            pass  # already recorded; the next index write retries

    def _evict(self, incoming: int) -> None:
        """Drop least recently used snapshots (any model) until `incoming` more bytes fit."""
        with self._lock:
            victims = self._index.lru_victims(self.budget_bytes, incoming)
            self.evictions += len(victims)
            collect = bool(victims or self._index.unused_packs())
        if collect:
            self._collect()

    def _clear_files(self) -> None:
        with self._lock:
            self._index.clear()
            self._dirty = True
        self._write_index()
        for name in os.listdir(self.pack_dir):
            if name.endswith(PACK_SUFFIX):
                unlink(self.pack_dir / name)

    def _write_index(self) -> None:
        """Atomically replace index.json with the in-memory index."""
        with self._lock:
            blob = self._index.to_json()
            self._dirty = False
        tmp = self.root / f"{TMP_PREFIX}index-{os.getpid()}.json"
        try:
            with open(tmp, "wb") as f:
                f.write(blob)
                f.flush()
                fsync(f.fileno())
            self.hooks.point("index_tmp")
            os.replace(tmp, self.index_path)
            fsync_dir(self.root)
        except BaseException:
            unlink(tmp)
            with self._lock:
                self._dirty = True
                self._retry_at = time.monotonic() + INDEX_RETRY_S  # no busy loop on a full disk
            raise
        with self._lock:
            self._retry_at = 0.0

    # -- errors and warnings -------------------------------------------------------------------
    def _record_error(self, e: BaseException) -> None:
        code = getattr(e, "errno", None)
        msg = f"{type(e).__name__}: {e}"
        with self._lock:
            self.write_errors += 1
            self.last_error = msg
            if code in (errno.EROFS, errno.EACCES, errno.EPERM):
                # These do not go away by themselves: stop writing for this session.
                self.writable = False
                self._queue.clear()
                self._pending_bytes = 0
        if code == errno.ENOSPC:
            self._warn("enospc", f"The disk is full: prompt cache snapshots are not being saved to {self.root} "
                                 "(replies are unaffected; the cache works in memory).")
        elif code in (errno.EROFS, errno.EACCES, errno.EPERM):
            self._warn("readonly", f"The prompt cache folder {self.root} is not writable ({os.strerror(code)}); "
                                   "the cache works in memory only this session.")
        else:
            self._warn("write", f"Saving the prompt cache to disk failed ({msg}); replies are unaffected.")

    def _warn(self, kind: str, message: str) -> None:
        with self._lock:
            if kind in self._warned:
                return
            self._warned.add(kind)
            self.warnings.append(message)
            self._unseen += 1
        log.warning("%s", message)  # once per kind, like the report's warning
        if self.on_warning is not None:
            try:
                self.on_warning(message)
            except Exception:
                pass

    def pop_warnings(self) -> list[str]:
        """Warnings not yet shown to the user (each problem is reported once)."""
        with self._lock:
            new = self.warnings[len(self.warnings) - self._unseen :] if self._unseen else []
            self._unseen = 0
            return new
