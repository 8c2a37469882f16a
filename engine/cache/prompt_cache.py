"""The prompt cache's front: the memory tier (engine/cache/memory_tier.py: snapshots over shared
blocks under a byte budget), the disk tier behind it, and when the disk writes. `fetch` asks the
planner what to restore and hands out a private copy (or the live cache of the reply that stored
the snapshot, handed over as it is: `keep_spare`); `store` keeps a snapshot of a live cache in
memory and queues it for the disk; `generation()` brackets a generation (the disk writer waits,
for a bounded time, while the model runs). The memory tier and the disk tier are steered from
here only: the engine reaches the disk tier through this front (`generation`, `pop_warnings`,
`close`), and a subclass changes only `fetch` (engine/distributed/agree.py's `AgreedPromptCache`,
which engine/distributed/serve.py builds around the engine's own disk tier)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, Protocol, Sequence

from engine.cache.families import rules_of
from engine.cache.blocks import in_blocks
from engine.cache.eviction import KEEP_DOCUMENTS, EvictionPolicy
from engine.cache.kinds import RestoreSource
from engine.cache.memory_tier import MemoryTier
from engine.cache.meta import SnapshotMeta
from engine.cache.planner import Plan, plan_restore
from engine.cache.block_state import SharedSnapshot
from engine.cache.snapshot import Snapshot, cache_arrays, restore_copy
from engine.errors import SnapshotError


class DiskTier(Protocol):
    """What the prompt cache needs from a persistent tier (engine/cache/disk/)."""

    def entries(self, model_key: str) -> list[SnapshotMeta]: ...
    def last_used(self, snapshot_id: str) -> float: ...  # when last written or read (0.0: unknown)
    def load(self, meta: SnapshotMeta, upto: Optional[int] = None) -> SharedSnapshot: ...  # SnapshotError if bad
    def save_async(self, snapshot: Snapshot) -> None: ...
    def remove(self, snapshot_id: str) -> None: ...
    def clear(self) -> None: ...
    def stats(self) -> dict[str, Any]: ...
    def pop_warnings(self) -> list[str]: ...  # problems the user has not been told about yet
    def hold_writes(self) -> None: ...  # a generation runs: background writes wait (bounded)
    def release_writes(self) -> None: ...
    def close(self, timeout: Optional[float] = None) -> bool: ...  # flush, stop writing, unlock


class PromptCache:
    """The memory tier, optionally written through to a disk tier.

    Only the engine's worker thread touches the arrays; statistics can be read from elsewhere.
    """

    def __init__(self, budget_bytes: int = 2 << 30, disk: Optional[DiskTier] = None,
                 policy: EvictionPolicy = KEEP_DOCUMENTS) -> None:  # fmt: skip
        self.memory = MemoryTier(budget_bytes, policy)
        self.disk = disk
        self.lookups = 0
        self.hits = 0
        self.spare_hits = 0  # restores that took over a reply's live cache: no copy before the first forward
        # (snapshot id, the live cache of the reply that stored it; None for layers kept whole):
        # at most one, kept until the next fetch, which uses it or drops it
        self._spare: Optional[tuple[str, list[Any]]] = None
        self.spares = True  # False: no spares, every restore copies first (bench/regen_spare.py's "before")
        self.preloaded: set[str] = set()  # read from the disk ahead of a restore (preload), not used yet

    @property
    def budget_bytes(self) -> int:
        return self.memory.budget_bytes

    def set_memory_budget(self, budget_bytes: int) -> None:
        """The memory tier's budget from now on: a smaller one evicts at once, and drops the spare
        live cache when it no longer fits what the budget leaves (the disk tier keeps its own)."""
        if budget_bytes < 0:
            raise ValueError("a memory budget is a number of bytes, 0 or more")
        self.memory.set_budget(budget_bytes)
        if self.spare_bytes() > self.memory.room():
            self._spare = None

    def spare_bytes(self) -> int:
        """Bytes of the live cache kept for a regenerate (keep_spare; 0: none)."""
        spare = self._spare
        return sum(a.nbytes for a in cache_arrays([c for c in spare[1] if c is not None])) if spare else 0

    # -- store ----------------------------------------------------------------------------------
    def store(self, meta: SnapshotMeta, cache: Sequence[Any], persist: bool = True) -> None:
        """Keep the snapshot `meta` of the live cache `cache` in memory (if it fits the budget;
        only the positions whose blocks the memory lacks are copied) and queue it for the disk
        tier (even if it does not fit: a long chat's state may exceed the memory budget, never
        the disk's reason). The live cache is not held: the generation may go on writing it."""
        if meta.length == 0:
            return
        shared = self.memory.add(meta, cache)
        if persist and self.disk is not None:
            self.disk.save_async(shared)

    def put(self, snapshot: Snapshot, persist: bool = True) -> None:
        """`store` for a snapshot's own cache objects (they are only read)."""
        self.store(snapshot.meta, snapshot.cache, persist)

    def keep_spare(self, snapshot_id: str, live: Sequence[Any]) -> None:
        """After a reply stored `snapshot_id` from the live cache `live`, which nothing else holds
        now (the snapshot copied what it keeps): keep `live`'s block layers as they are, for the
        next fetch of that snapshot (a regenerate) to hand over, cut back, instead of copying
        the state first. Kept only where its buffers fit in what the memory budget has left."""
        self._spare = None
        if not self.spares:
            return
        spare = [c if in_blocks(c) else None for c in live]
        arrays = cache_arrays([c for c in spare if c is not None])
        if not arrays or sum(a.nbytes for a in arrays) > self.memory.room():
            return
        self._spare = (snapshot_id, spare)

    def _take_spare(self, snapshot_id: str) -> Optional[list[Any]]:
        """The spare if it holds `snapshot_id`; the spare is dropped either way (used once)."""
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

    # -- lookup ---------------------------------------------------------------------------------
    def candidates(self, model_key: str) -> list[tuple[SnapshotMeta, RestoreSource]]:
        mem = [(m, RestoreSource.MEMORY) for m in self.memory.metas(model_key)]
        seen = {m.id for m, _ in mem}
        disk: list[tuple[SnapshotMeta, RestoreSource]] = []
        if self.disk is not None:
            disk = [(m, RestoreSource.DISK) for m in self.disk.entries(model_key) if m.id not in seen]
        return mem + disk

    def fetch(self, model_key: str, prompt: Sequence[int], mode: str, cuts: Sequence[int],
              singles_from: Optional[int] = None) -> tuple[Plan, Optional[list[Any]]]:
        """Plan a restore and return (plan, a private copy of the cache cut to plan.reuse);
        `singles_from`: a Continue's decoded tail (planner.reuse_point)."""
        self.lookups += 1
        declines: list[str] = []
        excluded: set[str] = set()
        while True:
            cands = [c for c in self.candidates(model_key) if c[0].id not in excluded]
            plan = plan_restore(cands, prompt, mode, cuts, singles_from,
                                self._spare[0] if self._spare is not None else None)
            plan.declines = declines + plan.declines
            if plan.meta is None:
                self._spare = None  # a generation from scratch: nothing will regenerate from it
                return plan, None
            try:
                spare = self._take_spare(plan.meta.id)
                cache = self._restore(plan.meta, plan.source, plan.reuse, spare)  # private, with room to grow
                if cache is None:  # the disk had only a prefix left (now in memory): plan again
                    declines.append(f"{plan.source} snapshot {plan.meta.id}: only a part of its "
                                    f"{plan.meta.length} tokens is left on disk")
                    if not self.memory.touch(plan.meta.id):
                        excluded.add(plan.meta.id)
                    continue
                if spare is not None:
                    self.spare_hits += 1
            except SnapshotError as e:
                declines.append(f"{plan.source} snapshot {plan.meta.id} unusable: {e}")
                excluded.add(plan.meta.id)
                # Forget the copy that failed, only that one: a memory copy that cannot be restored
                # says nothing about the file on disk (and a disk load that fails removes its own
                # entry, in DiskCache.load).
                if self.memory.touch(plan.meta.id):
                    self.memory.drop(plan.meta.id)
                continue
            self.hits += 1
            if plan.meta.id in self.preloaded:  # read from the disk ahead of time: its state came from there
                self.preloaded.discard(plan.meta.id)
                plan.source = RestoreSource.DISK
            return plan, cache

    def _restore(self, meta: SnapshotMeta, source: Optional[RestoreSource], upto: int,
                 spare: Optional[list[Any]]) -> Optional[list[Any]]:
        """A private copy of `meta`'s first `upto` tokens (read from the disk and promoted to
        memory if need be); None if the disk has fewer than `upto` left."""
        if self.memory.touch(meta.id):
            return self.memory.restore(meta.id, upto, spare)
        if source == RestoreSource.DISK and self.disk is not None:
            snap = self.disk.load(meta, upto)
            self.memory.adopt(snap)  # to memory as it was read (no copy)
            if snap.meta.length < upto:
                return None
            if self.memory.touch(snap.meta.id):
                return self.memory.restore(snap.meta.id, upto)
            return restore_copy(snap.full_cache(), upto)  # over the memory budget: restored, not kept
        raise SnapshotError("evicted")

    def preload(self, keys: Callable[[str], bool], wanted: Callable[[SnapshotMeta], bool]) -> list[str]:
        """Read into memory the disk snapshots under the lookup keys `keys` picks (a model's own,
        or each of its namespaces') that `wanted` picks and that fit in the memory tier's room
        (each read and checked as a restore would), newest first across all of them: after a
        restart, what every conversation about a document restores is then in memory before it
        is asked for. The one used last is also restored ahead, as the spare (`keep_spare`): the
        first question about it then starts with no copy at all, in buffers already touched. The
        ids read; a snapshot that fails its checks is skipped (the disk tier drops it)."""
        if self.disk is None:
            return []
        disk = self.disk
        picked = [k for k in disk.model_keys() if keys(k)]
        have = {m.id for k in picked for m in self.memory.metas(k)}
        # Newest first, by when each was last used (a read below counts as a use).
        metas = sorted((m for k in picked for m in disk.entries(k) if m.id not in have and wanted(m)),
                       key=lambda m: disk.last_used(m.id), reverse=True)
        out = []
        for meta in metas:
            if meta.nbytes > self.memory.room():
                continue
            try:
                self.memory.adopt(disk.load(meta))
            except SnapshotError:
                continue
            out.append(meta.id)
        self.preloaded.update(out)
        if out and self.memory.touch(out[0]):
            self.keep_spare(out[0], self.memory.cache_of(out[0]))
        return out

    # -- housekeeping ---------------------------------------------------------------------------
    def pop_warnings(self) -> list[str]:
        """The disk tier's problems the user has not been told about yet (each once)."""
        return self.disk.pop_warnings() if self.disk is not None else []

    def close(self) -> None:
        """Flush the disk tier's pending writes and release its folder (the memory tier needs nothing)."""
        if self.disk is not None:
            self.disk.close()

    def clear(self) -> None:
        self.memory.clear()
        self._spare = None
        if self.disk is not None:
            self.disk.clear()

    def stats(self) -> dict[str, Any]:
        """The memory tier's counts, and the disk tier's own stats under "disk" (None: no disk tier)."""
        mem = self.memory.stats()
        out: dict[str, Any] = {
            "memory_entries": mem["entries"],
            "memory_bytes": mem["bytes"],
            "memory_blocks": mem["blocks"],
            "memory_shared_bytes": mem["shared_bytes"],
            "memory_budget_bytes": self.memory.budget_bytes,
            "lookups": self.lookups,
            "hits": self.hits,
            "spare_hits": self.spare_hits,
        }
        out["disk"] = self.disk.stats() if self.disk is not None else None
        return out

    def metas(self) -> list[SnapshotMeta]:
        return self.memory.metas()
