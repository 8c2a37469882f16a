"""The memory tier of the prompt cache: snapshots as manifests over shared blocks, under a byte budget.

Like the disk tier (engine/cache/disk/), a snapshot here is its meta and the names of its blocks
(engine/cache/blocks.py: the state of positions [a, b) of every layer kept in blocks, named by
its history), plus the whole state of the layers that cannot be cut by position. A put copies
only the positions whose blocks the tier lacks, once, into new buffers (`MemPack`: one for the
blocks up to the snapshot's last exact cut, which later turns share, one for the decoded tail),
so four variants of one prompt, or the turns of one chat, hold their shared prefix once.

The budget counts each pack once, while any block of it is in use, and each snapshot's whole
pieces. Eviction drops snapshots in the order of the tier's `EvictionPolicy` (engine/cache/
eviction.py; by default least recently used first); a block goes when no snapshot names it
(a hash chain: a snapshot naming block k names every block before it, so nothing is stranded),
a pack when none of its blocks is left.

Nothing here is ever handed out: `restore` builds one new buffer per layer (the blocks' positions
joined, with room to grow), and `SharedSnapshot` gives the disk writer read-only slices of the
packs. The packs are copies (`mx.array`), never `copy.deepcopy` of a live buffer's slice, which
shares the buffer: the generation that goes on writing into it would then copy it whole first.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from typing import Any, Optional, Sequence

import mlx.core as mx

from engine.cache.block_state import (
    MemBlock,
    MemEntry,
    MemPack,
    SharedSnapshot,
    State,
    block_arrays,
    kv_pair,
    owned_copy,
    position_bytes,
    state_nbytes,
    runs_of,
)
from engine.cache.env import compute_env
from engine.cache.eviction import KEEP_DOCUMENTS, EvictionPolicy
from engine.cache.families import rules_of
from engine.cache.blocks import block_bounds, block_keys, layers_in_blocks, pack_groups
from engine.cache.meta import SnapshotMeta
from engine.cache.planner import dominates
from engine.cache.snapshot import GROW_ROOM, cache_arrays, joined, sliced, whole_copy, with_kv

def _bytes_of(whole: Sequence[Any]) -> int:
    return sum(a.nbytes for a in cache_arrays([w for w in whole if w is not None]))


class MemoryTier:
    """Snapshots in memory over shared blocks, an LRU under `budget_bytes` (see the module doc).

    Only the engine's worker thread reads arrays; the lock guards the bookkeeping, so statistics
    can be read from elsewhere.
    """

    def __init__(self, budget_bytes: int, policy: EvictionPolicy = KEEP_DOCUMENTS) -> None:
        self.budget_bytes = budget_bytes
        self.policy = policy  # which snapshot goes first over the budget (engine/cache/eviction.py)
        self.env = compute_env()
        self._items: "OrderedDict[str, MemEntry]" = OrderedDict()
        self._blocks: dict[str, MemBlock] = {}
        self._users: dict[str, int] = {}  # block name -> snapshots naming it
        self._bytes = 0
        self._lock = threading.RLock()

    # -- store ----------------------------------------------------------------------------------
    def add(self, meta: SnapshotMeta, cache: Sequence[Any]) -> SharedSnapshot:
        """Store the snapshot `meta` of `cache` (a live cache's layers: only the positions whose
        blocks are missing are copied) and return it as the disk writer takes it. A snapshot
        larger than the budget is not kept, but returned all the same (the disk has its own)."""
        blocked = layers_in_blocks(cache)
        names = block_keys(meta, self.env) if any(blocked) else []
        bounds = block_bounds(meta) if names else []
        blocks = self._have(names)
        have = len(blocks)
        new = list(zip(bounds[have:], names[have:]))
        # The decoded tail gets a pack of its own: it goes when a later turn makes it redundant.
        for group in pack_groups(new, meta.canonical):
            a, b = group[0][0][0], group[-1][0][1]
            layers: list[Optional[tuple[State, State]]] = [
                tuple(owned_copy(sliced(x, a, b)) for x in kv_pair(c)) if bl else None  # type: ignore[misc]
                for c, bl in zip(cache, blocked)]
            pack = MemPack(a, b, layers, sum(state_nbytes(kv) for kv in layers if kv is not None))
            blocks += [MemBlock(key, pack, s, e) for (s, e), key in group]
        templates, whole = [], []
        for c, bl in zip(cache, blocked):
            if bl:
                t = copy.copy(c)
                t.keys = t.values = None
                templates.append(t)
                whole.append(None)
            else:
                templates.append(None)
                whole.append(rules_of(c).clone(c))
        arrays = [a for blk in blocks[have:] for kv in blk.pack.layers if kv is not None for a in block_arrays(kv)]
        mx.eval(arrays + cache_arrays([w for w in whole if w is not None]))
        shared = SharedSnapshot(meta, [t if t is not None else w for t, w in zip(templates, whole)], blocks, blocked)
        self._keep(MemEntry(meta, names, templates, whole, _bytes_of(whole)), blocks)
        return shared

    def adopt(self, snap: SharedSnapshot) -> None:
        """Keep a snapshot the disk tier read (its packs are the file's arrays, nobody else's):
        blocks the tier has already are used instead of the snapshot's own."""
        names = [b.key for b in snap.blocks]
        mine = self._have(names)
        blocks = mine + snap.blocks[len(mine):]
        blocked = snap.layers_in_blocks()
        templates = [c if b else None for c, b in zip(snap.cache, blocked)]
        whole = [None if b else c for c, b in zip(snap.cache, blocked)]
        self._keep(MemEntry(snap.meta, names, templates, whole, _bytes_of(whole)), blocks)

    def _have(self, names: Sequence[str]) -> list[MemBlock]:
        """The tier's blocks for the longest prefix of `names` it holds."""
        with self._lock:
            out = []
            for k in names:
                blk = self._blocks.get(k)
                if blk is None:
                    break
                out.append(blk)
            return out

    def _keep(self, entry: MemEntry, blocks: list[MemBlock]) -> None:
        """Insert `entry` if it fits the budget, dropping what it dominates and what the budget
        then has no room for (least recently used first)."""
        meta = entry.meta
        if meta.nbytes > self.budget_bytes:
            return
        with self._lock:
            for sid, other in list(self._items.items()):
                if other.meta.model_key == meta.model_key and dominates(meta, other.meta):
                    self._drop(sid)
            self._insert(entry, blocks)
            self._evict()

    def _insert(self, entry: MemEntry, blocks: list[MemBlock]) -> None:
        old = self._items.pop(entry.meta.id, None)
        if old is not None:
            self._release(old)
        for blk in blocks:
            if blk.key not in self._blocks:
                self._blocks[blk.key] = blk
                if blk.pack.n_blocks == 0:
                    self._bytes += blk.pack.nbytes
                blk.pack.n_blocks += 1
        for k in entry.block_names:
            self._users[k] = self._users.get(k, 0) + 1
        self._bytes += entry.whole_bytes
        self._items[entry.meta.id] = entry

    def _release(self, entry: MemEntry) -> None:
        """Forget `entry`'s claim on its blocks; free the blocks (and packs) nobody names now."""
        self._bytes -= entry.whole_bytes
        for k in entry.block_names:
            left = self._users[k] - 1
            if left > 0:
                self._users[k] = left
                continue
            del self._users[k]
            blk = self._blocks.pop(k)
            blk.pack.n_blocks -= 1
            if blk.pack.n_blocks == 0:
                self._bytes -= blk.pack.nbytes

    def _drop(self, sid: str) -> None:
        self._release(self._items.pop(sid))

    def set_budget(self, budget_bytes: int) -> None:
        """Hold at most `budget_bytes` from now on: a smaller budget evicts at once (in the policy's
        order, as a put over the budget does)."""
        with self._lock:
            self.budget_bytes = budget_bytes
            self._evict()

    def _evict(self) -> None:
        while self._bytes > self.budget_bytes and self._items:
            # `_items` is in use order (touch moves to the end): its position is the clock
            self._drop(self.policy.first((sid, e.meta, i) for i, (sid, e) in enumerate(self._items.items())))

    def drop(self, sid: str) -> None:
        with self._lock:
            if sid in self._items:
                self._drop(sid)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._blocks.clear()
            self._users.clear()
            self._bytes = 0

    # -- lookup ---------------------------------------------------------------------------------
    def touch(self, sid: str) -> bool:
        """Mark `sid` as just used; False if it is not here."""
        with self._lock:
            if sid not in self._items:
                return False
            self._items.move_to_end(sid)
            return True

    def metas(self, model_key: Optional[str] = None) -> list[SnapshotMeta]:
        with self._lock:
            return [e.meta for e in self._items.values() if model_key is None or e.meta.model_key == model_key]

    def room(self) -> int:
        with self._lock:
            return self.budget_bytes - self._bytes

    def restore(self, sid: str, n: int, spare: Optional[Sequence[Any]] = None) -> list[Any]:
        """A private copy of snapshot `sid`'s layers holding its first `n` tokens: a block layer is
        one new buffer of its blocks' first `n` positions with room to grow (the first forward
        writes into it in place), or the layer of `spare` (a cache nobody else holds that holds at
        least `n` of these tokens) handed over as it is, cut back to `n`; a whole layer is cloned
        and cut back (families.cut_back raises SnapshotError where it cannot be)."""
        with self._lock:
            entry = self._items[sid]
            blocks = [self._blocks[k] for k in entry.block_names]
        runs = runs_of(blocks, n)
        out: list[Any] = []
        for i, (t, w) in enumerate(zip(entry.templates, entry.whole)):
            if t is not None:
                ready = spare[i] if spare is not None else None
                if ready is not None and ready.offset >= n:
                    ready.offset = n
                    out.append(ready)
                    continue
                parts = [tuple(sliced(x, s - p.start, e - p.start) for x in p.layers[i]) for p, s, e in runs]
                out.append(with_kv(t, joined([p[0] for p in parts], GROW_ROOM), joined([p[1] for p in parts], GROW_ROOM), n))
            else:
                out.append(whole_copy(w, n))
        mx.eval(cache_arrays(out))
        return out

    def cache_of(self, sid: str) -> list[Any]:
        """A new copy of snapshot `sid`'s whole state: what the read-ahead hands to the first
        question (PromptCache.preload), what tests compare bit for bit before and after."""
        with self._lock:
            n = self._items[sid].meta.length
        return self.restore(sid, n)

    # -- statistics -----------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        with self._lock:
            named = sum(position_bytes(b.pack) * (b.end - b.start)
                        for e in self._items.values() for b in (self._blocks[k] for k in e.block_names))
            unique = self._bytes - sum(e.whole_bytes for e in self._items.values())  # each pack once
            return {"entries": len(self._items), "bytes": self._bytes, "blocks": len(self._blocks),
                    "shared_bytes": max(0, named - unique)}
