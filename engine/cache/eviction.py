"""Which snapshot a tier drops first when it is over its budget: the one seam both tiers ask.

`EvictionPolicy.keep_priority` ranks snapshots (higher: kept longer); among equals the least
recently used goes first. `EvictionPolicy` itself gives every snapshot priority 0 (plain LRU);
both tiers use `KEEP_DOCUMENTS` unless given another (`MemoryTier(policy=)`, `DiskCache(policy=)`):
a "document" snapshot (the state at an attached document's end, engine/documents) goes after
every ordinary turn, as it is what every conversation about that file restores. A policy only
orders candidates: what a tier may drop at all (the disk frees a shared pack only with its last
user) stays the tier's own rule.
"""

from __future__ import annotations

from typing import Hashable, Iterable, TypeVar

from engine.cache.meta import SnapshotMeta

K = TypeVar("K", bound=Hashable)


class EvictionPolicy:
    """Least recently used first, within the lowest keep priority (see the module doc)."""

    def keep_priority(self, meta: SnapshotMeta) -> int:
        """How strongly to keep `meta` (higher: evicted later). Default: 0 for all (plain LRU)."""
        return 0

    def order(self, items: Iterable[tuple[K, SnapshotMeta, float]]) -> list[K]:
        """The keys of `items` ((key, meta, last used: any increasing clock)), first to go first."""
        ranked = sorted(items, key=lambda x: (self.keep_priority(x[1]), x[2]))
        return [k for k, _, _ in ranked]

    def first(self, items: Iterable[tuple[K, SnapshotMeta, float]]) -> K:
        """The key of the snapshot to drop first (`items` not empty)."""
        return min(items, key=lambda x: (self.keep_priority(x[1]), x[2]))[0]


class DocumentsKept(EvictionPolicy):
    """Documents' states last: the least recently used ordinary snapshot goes first, then the
    least recently used document."""

    def keep_priority(self, meta: SnapshotMeta) -> int:
        return 1 if meta.kind == "document" else 0


LRU = EvictionPolicy()
KEEP_DOCUMENTS = DocumentsKept()
