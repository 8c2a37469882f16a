"""The disk writer's queue: the tasks waiting for the writer thread, and the holds on them.

The front (tier.py) queues tasks here (save a snapshot, delete, clear, mark used); the writer
thread, which belongs to the index's owner (store.py: `DiskStore.start`), takes them one at a
time (`next_task`, then `task_done`) and asks the queue about what is still waiting. The queue
calls nothing of the store: it only hands out tasks and answers. A generation holds writes
(`hold_writes`) so that none competes with prefill and decode for the CPU; `flush` waits until
the queue is empty and no task is being done.

`_cond`'s lock guards every field below that changes after `__init__`: the queue and its pending
bytes, the task in progress (`_busy`), the holds, the callers in `flush`, the start of the save
being written, the sync the store asked for, the stop, and the thread that takes the tasks. It is
never held while a task is done: the engine thread's `hold_writes`, `save_async` and `flush`
bookkeeping wait for at most another queue operation, never for an eviction, a rescan or a file
write (bench/disk_writer_lock.py measures it).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Optional

from engine.cache.disk.hooks import WriterHooks
from engine.cache.snapshot import Snapshot

MAX_PENDING_BYTES = 1 << 30  # snapshots queued for writing; beyond this the oldest are dropped
# A generation holds writes, but never for longer than this per queued write: a server that
# generates back to back still gets a finished reply's blocks on disk within seconds (the writer
# runs at the lowest priority; docs/benchmarks.md measures what that costs a decode step).
MAX_HOLD_S = 2.0


class WriteKind(StrEnum):
    """What a task asks of the index's owner (`DiskStore.do` dispatches on it)."""

    SAVE = "save"  # write a snapshot's new packs and commit its manifest
    DELETE = "delete"  # forget snapshots (`ids`), then delete the packs nobody uses
    CLEAR = "clear"  # forget everything, delete every pack
    TOUCH = "touch"  # snapshots (`ids`) were used at `at`
    SYNC = "sync"  # write the index if it is behind, apply the budget


@dataclass
class WriteTask:
    """One piece of work for the writer thread."""

    kind: WriteKind
    snapshot: Optional[Snapshot] = None
    ids: list[str] = field(default_factory=list)
    nbytes: int = 0
    at: float = 0.0  # touch: when the snapshots were used (time.time())
    queued: float = field(default_factory=time.monotonic)


class WriteQueue:
    """The tasks, the holds and the flushes (see the module doc)."""

    def __init__(self, hooks: WriterHooks, max_pending_bytes: int = MAX_PENDING_BYTES) -> None:
        self.hooks = hooks
        self.max_pending_bytes = max_pending_bytes
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[WriteTask] = deque()
        self._pending_bytes = 0
        self._busy = False  # a task is being done
        self._holds = 0  # generations in progress: the writer waits for them (see hold_writes)
        self._write_started: Optional[float] = None  # monotonic time the current save began
        self._flushers = 0  # callers in flush(): a hold must not make them wait for ever
        self._sync_at: Optional[float] = None  # the owner wants a sync from then (a failed index write)
        self._stop = False
        self._taker: Optional[threading.Thread] = None  # the thread that takes the tasks

    def use_hooks(self, hooks: WriterHooks) -> None:
        """Observe the held and paused points with `hooks` from now on (tests)."""
        self.hooks = hooks

    # -- the front's side ----------------------------------------------------------------------
    def submit(self, task: WriteTask) -> bool:
        """Queue a task; False once stopped."""
        with self._cond:
            if self._stop:
                return False
            self._queue.append(task)
            self._cond.notify()
            return True

    def submit_save(self, snapshot: Snapshot) -> int:
        """Queue a save; how many older queued saves were dropped to stay within
        `max_pending_bytes` (a writer far behind must not pin unbounded memory)."""
        dropped = 0
        with self._cond:
            if self._stop:
                return 0
            self._queue.append(WriteTask(WriteKind.SAVE, snapshot, nbytes=snapshot.meta.nbytes))
            self._pending_bytes += snapshot.meta.nbytes
            while self._pending_bytes > self.max_pending_bytes:
                old = next((t for t in self._queue if t.kind == WriteKind.SAVE), None)
                if old is None or old.snapshot is snapshot:
                    break
                self._queue.remove(old)
                self._pending_bytes -= old.nbytes
                dropped += 1
            self._cond.notify()
        return dropped

    def pending(self) -> int:
        """Saves queued or in progress."""
        with self._cond:
            return sum(1 for t in self._queue if t.kind == WriteKind.SAVE) + (1 if self._busy else 0)

    @property
    def holds(self) -> int:
        with self._cond:
            return self._holds

    def hold_writes(self) -> None:
        """A generation starts: queued writes wait until `release_writes` (a write already in
        progress pauses between arrays). Disk writes then never compete with prefill and decode
        for the CPU (docs/benchmarks.md, item 4, has the measurement)."""
        with self._cond:
            self._holds += 1

    def release_writes(self) -> None:
        with self._cond:
            self._holds = max(0, self._holds - 1)
            self._cond.notify_all()

    def _sync_due(self) -> bool:
        return self._sync_at is not None and time.monotonic() >= self._sync_at

    def _settled(self) -> bool:
        """Nothing left for the writer (an index write that keeps failing counts as settled)."""
        return not self._queue and not self._busy and not self._sync_due()

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until every queued write is on disk; False if `timeout` ran out first, or if no
        thread takes the tasks (never started, or ended)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._flushers += 1
            self._cond.notify_all()
            try:
                while not self._settled():
                    if self._taker is None or not self._taker.is_alive():
                        return False
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._cond.wait(0.5 if left is None else min(left, 0.5))
            finally:
                self._flushers -= 1
        return True

    def stop(self) -> None:
        """Hand out no more tasks: the taker ends after the task in progress."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()

    # -- the writer thread's side (the store's) ------------------------------------------------
    def taken_by(self, thread: threading.Thread) -> None:
        """`thread` takes the tasks from now on (flush stops waiting once it has ended)."""
        with self._cond:
            self._taker = thread

    def next_task(self) -> Optional[WriteTask]:
        """The next task to do, once no generation holds it (or the hold ran out); a sync when the
        store asked for one and its time has come; None once stopped. Blocks until then."""
        with self._cond:
            while True:
                held = self._held(self._queue[0].queued if self._queue else None)
                if self._queue and not held:
                    task = self._queue.popleft()
                    if task.kind == WriteKind.SAVE:
                        self._pending_bytes -= task.nbytes
                    break
                if self._sync_due() and not held:
                    self._sync_at = None
                    task = WriteTask(WriteKind.SYNC)
                    break
                if self._stop:
                    return None
                if held and self._queue:
                    self.hooks.point("held")
                    self._cond.wait(0.1)  # the hold has a time limit: look again soon
                    continue
                wait = None if self._sync_at is None else max(0.05, self._sync_at - time.monotonic())
                self._cond.wait(wait)
            self._busy = True
            return task

    def task_done(self) -> None:
        with self._cond:
            self._busy = False
            self._cond.notify_all()

    def queued_saves(self) -> list[Snapshot]:
        """The snapshots waiting to be saved, oldest first."""
        with self._cond:
            return [t.snapshot for t in self._queue if t.kind == WriteKind.SAVE and t.snapshot is not None]

    def queue_empty(self) -> bool:
        with self._cond:
            return not self._queue

    def discard_all(self) -> None:
        """Drop every queued task (the folder cannot be written any more)."""
        with self._cond:
            self._queue.clear()
            self._pending_bytes = 0

    def sync_at(self, when: Optional[float]) -> None:
        """The store wants a sync task at monotonic time `when` (None: it does not)."""
        with self._cond:
            self._sync_at = when
            self._cond.notify_all()

    def _held(self, since: Optional[float]) -> bool:
        """Must the writer wait for a generation? Not past MAX_HOLD_S after `since` (when the
        oldest write was queued, or the current one started), nor while someone flushes."""
        if self._holds <= 0 or self._flushers or self._stop:
            return False
        return since is None or time.monotonic() - since < MAX_HOLD_S

    def begin_write(self) -> None:
        with self._cond:
            self._write_started = time.monotonic()

    def end_write(self) -> None:
        with self._cond:
            self._write_started = None

    def wait_while_held(self) -> None:
        """Called by the writer between pieces of a write: a generation that started meanwhile
        gets the CPU (and the GIL) back at once; the temp file simply waits to be finished
        (at most MAX_HOLD_S from the start of this write)."""
        with self._cond:
            since = self._write_started
            if self._held(since):
                self.hooks.point("paused")
            while self._held(since):
                self._cond.wait(0.1)
