"""The prompt cache's front: the memory tier (an LRU of snapshots under a byte budget), the
disk tier behind it, and when the disk writes. `fetch` asks the planner what to restore and
hands out a private copy (a spare copied in the background after the reply that stored the
snapshot, where there is one: `keep_spare`); `put` stores a snapshot in memory and queues it for the disk;
`generation()` brackets a generation (the disk writer waits, for a bounded time, while the
model runs). The memory tier and the disk tier are steered from here only."""

from __future__ import annotations

import threading
from collections import OrderedDict
from contextlib import contextmanager
from typing import Any, Iterator, Optional, Sequence

import mlx.core as mx

from engine.cache.planner import Plan, SnapshotMeta, dominates, plan_restore
from engine.cache.snapshot import DiskTier, Snapshot, cache_arrays, restore_copy, spare_layers
from engine.errors import SnapshotError


class PromptCache:
    """An LRU of snapshots under a byte budget, optionally written through to a disk tier.

    Only the engine's worker thread touches the arrays; the lock guards the bookkeeping so
    statistics can be read from elsewhere.
    """

    def __init__(self, budget_bytes: int = 2 << 30, disk: Optional[DiskTier] = None) -> None:
        self.budget_bytes = budget_bytes
        self.disk = disk
        self._items: "OrderedDict[str, Snapshot]" = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.lookups = 0
        self.hits = 0
        self.spare_hits = 0  # restores that used a spare: no copy before the first forward
        # (snapshot id, its layers copied privately after the reply that stored it): at most one,
        # kept until the next fetch, which uses it or drops it
        self._spare: Optional[tuple[str, list[Any]]] = None
        self.spares = True  # False: no spares, every restore copies first (bench/regen_spare.py's "before")

    # -- store ----------------------------------------------------------------------------------
    def put(self, snapshot: Snapshot, persist: bool = True) -> None:
        """Keep `snapshot` in memory (if it fits the budget) and queue it for the disk tier (even if
        it does not: a long chat's state may exceed the memory budget, never the disk's reason)."""
        meta = snapshot.meta
        if meta.length == 0:
            return
        if persist and self.disk is not None:
            self.disk.save_async(snapshot)
        if meta.nbytes > self.budget_bytes:
            return
        with self._lock:
            for sid, other in list(self._items.items()):
                if other.meta.model_key == meta.model_key and dominates(meta, other.meta):
                    self._drop(sid)
            self._items[meta.id] = snapshot
            self._bytes += meta.nbytes
            while self._bytes > self.budget_bytes and self._items:
                self._drop(next(iter(self._items)))

    def keep_spare(self, snapshot_id: str, live: Sequence[Any]) -> None:
        """After a reply stored `snapshot_id` from the live cache `live`: copy its block layers
        into new buffers in the background (`mx.async_eval`, off the critical path), for the next
        fetch of that snapshot (a regenerate) to hand over instead of copying then. The copy is
        the spare's own memory: neither the snapshot (whose arrays view the live buffer), nor the
        disk writer serialising them, nor the live cache shares it."""
        if not self.spares:
            self._spare = None
            return
        spare = spare_layers(live)
        arrays = cache_arrays([d for d in spare if d is not None])
        # The spare is memory too: it is kept only where it fits in what the memory tier's
        # budget has left (a large model's long chat restores by copying, as before).
        with self._lock:
            room = self.budget_bytes - self._bytes
        if not arrays or sum(a.nbytes for a in arrays) > room:
            self._spare = None
            return
        mx.async_eval(arrays)
        self._spare = (snapshot_id, spare)

    def _take_spare(self, snapshot_id: str) -> Optional[list[Any]]:
        """The spare if it copies `snapshot_id`; the spare is dropped either way (used once)."""
        spare, self._spare = self._spare, None
        return spare[1] if spare is not None and spare[0] == snapshot_id else None

    @contextmanager
    def generation(self) -> Iterator[None]:
        """A generation runs inside: disk writes queued meanwhile wait (at most the disk tier's
        `MAX_HOLD_S` each, so a server busy back to back still persists), then go."""
        disk = self.disk
        if disk is not None:
            disk.hold_writes()
        try:
            yield
        finally:
            if disk is not None:
                disk.release_writes()

    def _drop(self, sid: str) -> None:
        snap = self._items.pop(sid)
        self._bytes -= snap.meta.nbytes

    # -- lookup ---------------------------------------------------------------------------------
    def candidates(self, model_key: str) -> list[tuple[SnapshotMeta, str]]:
        with self._lock:
            mem = [(s.meta, "memory") for s in self._items.values() if s.meta.model_key == model_key]
        seen = {m.id for m, _ in mem}
        disk: list[tuple[SnapshotMeta, str]] = []
        if self.disk is not None:
            disk = [(m, "disk") for m in self.disk.entries(model_key) if m.id not in seen]
        return mem + disk

    def fetch(self, model_key: str, prompt: Sequence[int], mode: str, cuts: Sequence[int]
              ) -> tuple[Plan, Optional[list[Any]]]:
        """Plan a restore and return (plan, a private copy of the cache cut to plan.reuse)."""
        self.lookups += 1
        declines: list[str] = []
        excluded: set[str] = set()
        while True:
            cands = [c for c in self.candidates(model_key) if c[0].id not in excluded]
            plan = plan_restore(cands, prompt, mode, cuts)
            plan.declines = declines + plan.declines
            if plan.meta is None:
                self._spare = None  # a generation from scratch: nothing will regenerate from it
                return plan, None
            try:
                snap = self._get(plan.meta, plan.source, plan.reuse)
                if snap.meta.length < plan.reuse:  # the disk had only a prefix left: plan again
                    declines.append(f"{plan.source} snapshot {plan.meta.id}: only {snap.meta.length} "
                                    f"of {plan.meta.length} tokens left on disk")
                    continue
                spare = self._take_spare(plan.meta.id)
                cache = restore_copy(snap.cache, plan.reuse, spare)  # private, with room to grow
                if spare is not None:
                    self.spare_hits += 1
            except SnapshotError as e:
                declines.append(f"{plan.source} snapshot {plan.meta.id} unusable: {e}")
                excluded.add(plan.meta.id)
                if self.disk is not None:
                    self.disk.remove(plan.meta.id)
                continue
            self.hits += 1
            return plan, cache

    def _get(self, meta: SnapshotMeta, source: Optional[str], upto: Optional[int] = None) -> Snapshot:
        with self._lock:
            snap = self._items.get(meta.id)
            if snap is not None:
                self._items.move_to_end(meta.id)
                return snap
        if source == "disk" and self.disk is not None:
            snap = self.disk.load(meta, upto)
            snap.source = "disk"
            self.put(snap, persist=False)  # promote to memory
            return snap
        raise SnapshotError("evicted")

    # -- housekeeping ---------------------------------------------------------------------------
    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0
        self._spare = None
        if self.disk is not None:
            self.disk.clear()

    def stats(self) -> dict[str, Any]:
        """The memory tier's counts, and the disk tier's own stats under "disk" (None: no disk tier)."""
        with self._lock:
            out: dict[str, Any] = {
                "memory_entries": len(self._items),
                "memory_bytes": self._bytes,
                "memory_budget_bytes": self.budget_bytes,
                "lookups": self.lookups,
                "hits": self.hits,
                "spare_hits": self.spare_hits,
            }
        out["disk"] = self.disk.stats() if self.disk is not None else None
        return out

    def metas(self) -> list[SnapshotMeta]:
        with self._lock:
            return [s.meta for s in self._items.values()]
