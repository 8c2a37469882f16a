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

from typing import Hashable, Iterable, Optional, TypeVar

from engine.cache.kinds import SnapshotKind
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
    """Documents' states last, while a conversation uses them: the least recently used ordinary
    snapshot goes first, then the least recently used document.

    `in_use`: the digests of the documents some conversation still has (the app's store tells
    them: `Engine.keep_documents`). A document snapshot is kept ahead while the documents a
    conversation needs to restore it are in use: its first one when it can be cut back (its
    state up to that document's end serves every conversation that starts with it; a smaller
    document snapshot it extends was dropped as redundant, planner.dominates), else all of them
    (only a conversation about all of them, in that order, restores it). Otherwise it is an
    ordinary snapshot again. None (the default, and a server's: its clients' conversations are
    not known) keeps every document's state ahead; so does a snapshot that names no documents
    (written before they were recorded)."""

    def __init__(self, in_use: Optional[Iterable[str]] = None) -> None:
        self.in_use: Optional[frozenset[str]] = None if in_use is None else frozenset(in_use)

    def keep_priority(self, meta: SnapshotMeta) -> int:
        if meta.kind != SnapshotKind.DOCUMENT:
            return 0
        used = self.in_use  # one read: another thread may set it meanwhile
        needed = meta.documents[:1] if meta.trimmable else meta.documents
        return 1 if used is None or all(d in used for d in needed) else 0


LRU = EvictionPolicy()
KEEP_DOCUMENTS = DocumentsKept()  # every document kept ahead (an engine makes its own: keep_documents)
