"""`SnapshotMeta`: everything about a snapshot except its arrays (what both tiers' indexes keep,
what the planner plans from, what a pack's header and the disk index record)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.cache.kinds import SnapshotKind


@dataclass
class SnapshotMeta:
    """Everything about a snapshot except its arrays (what the disk index keeps)."""

    id: str
    model_key: str
    tokens: tuple[int, ...]
    kind: SnapshotKind
    exact_cuts: tuple[int, ...]  # ascending cuts of a canonical history, each <= len(tokens)
    classes: tuple[str, ...]
    trimmable: bool
    nbytes: int
    # The forwards that computed positions [0, length), as (start, end) pairs in order (decode
    # steps are (p, p + 1)); () when unknown, which keeps its blocks from ever being shared.
    forwards: tuple[tuple[int, int], ...] = ()
    # Where its blocks end besides `length`: the schedule's cuts it was prefilled at, and the
    # restore point it started from (engine/cache/blocks.py).
    block_ends: tuple[int, ...] = ()
    # A document snapshot: the digests (Document.digest: the file's SHA-256) of the attached
    # documents its state holds, in order; what tells eviction whether a conversation still
    # uses it (engine/cache/eviction.py). () for every other kind, and for older packs.
    documents: tuple[str, ...] = ()

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def canonical(self) -> int:
        """How far this snapshot's state equals a cold run's (its last exact cut)."""
        return self.exact_cuts[-1] if self.exact_cuts else 0
