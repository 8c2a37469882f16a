"""The memory tier of the prompt cache: snapshots as manifests over shared blocks, under a byte budget.

Like the disk tier (engine/cache/disk/), a snapshot here is its meta and the names of its blocks
(engine/cache/blocks.py: the state of positions [a, b) of every layer kept in blocks, named by
its history), plus the whole state of the layers that cannot be cut by position. A put copies
only the positions whose blocks the tier lacks, once, into new buffers (`MemPack`: one for the
blocks up to the snapshot's last exact cut, which later turns share, one for the decoded tail),
so four variants of one prompt, or the turns of one chat, hold their shared prefix once.

The budget counts each pack once, while any block of it is in use, and each snapshot's whole
pieces. Eviction drops least recently used snapshots; a block goes when no snapshot names it
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
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import mlx.core as mx
from mlx.utils import tree_flatten

from engine.cache.blocks import block_bounds, block_keys
from engine.cache.disk.format import compute_env
from engine.cache.families import rules_of
from engine.cache.planner import SnapshotMeta, dominates
from engine.cache.snapshot import GROW_ROOM, Snapshot, cache_arrays, sliced, whole_copy

State = Any  # a layer's state: an array, or a tuple of them (quantized KV: (packed, scales, biases))


def _arrays(x: State) -> list[mx.array]:
    return [v for _, v in tree_flatten(x) if isinstance(v, mx.array)]


def _nbytes(x: State) -> int:
    return sum(a.nbytes for a in _arrays(x))


def _owned(x: State) -> State:
    """A copy in new memory (`mx.array` copies; `copy.deepcopy` would share the buffer)."""
    if isinstance(x, mx.array):
        return mx.array(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_owned(v) for v in x)
    return x


def _joined(parts: list[State], room: int) -> State:
    """The parts joined along positions in one new buffer, with `room` zero positions after."""
    first = parts[0]
    if isinstance(first, mx.array):
        pad = [mx.zeros((*first.shape[:-2], room, first.shape[-1]), dtype=first.dtype)] if room else []
        return mx.concatenate([*parts, *pad], axis=-2)
    return type(first)(_joined([p[i] for p in parts], room) for i in range(len(first)))


def _kv_pair(c: Any) -> tuple[State, State]:
    """(keys, values) of a KV layer, the used positions only (views: the caller copies)."""
    n = c.offset
    return sliced(c.keys, 0, n), sliced(c.values, 0, n)


@dataclass
class MemPack:
    """Positions [start, end) of every block layer of one save, in new buffers (None: a layer kept whole)."""

    start: int
    end: int
    layers: list[Optional[tuple[State, State]]]
    nbytes: int
    blocks: int = 0  # blocks of it still named by a snapshot


@dataclass
class MemBlock:
    key: str
    pack: MemPack
    start: int
    end: int


@dataclass
class MemEntry:
    """A snapshot in memory: its meta, its blocks' names in order, its layers kept whole."""

    meta: SnapshotMeta
    blocks: list[str]
    templates: list[Any]  # per layer: an empty copy of the layer object (block layers) or None
    whole: list[Any]  # per layer: the whole layer's private clone (layers not in blocks) or None
    whole_bytes: int


def _runs(blocks: Sequence[MemBlock], n: int) -> list[tuple[MemPack, int, int]]:
    """(pack, start, end) of the blocks' positions below `n`, consecutive blocks of one pack merged."""
    out: list[tuple[MemPack, int, int]] = []
    for blk in blocks:
        if blk.start >= n:
            break
        end = min(n, blk.end)
        if out and out[-1][0] is blk.pack and out[-1][2] == blk.start:
            out[-1] = (blk.pack, out[-1][1], end)
        else:
            out.append((blk.pack, blk.start, end))
    return out


def _position_bytes(pack: MemPack) -> int:
    """Bytes one position takes in the block layers."""
    return sum(a.nbytes // max(1, a.shape[-2]) for kv in pack.layers if kv is not None for a in _arrays(kv))


class SharedSnapshot(Snapshot):
    """A snapshot made of memory blocks, as the disk writer sees it: `span_state` slices the pack
    holding the positions (the writer's packs never cross `run_ends`, so no join is needed), the
    whole layers are the entry's clones. Read-only: nothing writes into these arrays."""

    def __init__(self, meta: SnapshotMeta, cache: list[Any], blocks: list[MemBlock]) -> None:
        super().__init__(meta, cache)
        self._blocks = blocks

    def span_state(self, i: int, a: int, b: int) -> Any:
        parts = [(p, s, e) for p, s, e in _runs(self._blocks, b) if e > a]
        parts = [(p, max(a, s), e) for p, s, e in parts]
        states = [tuple(sliced(x, s - p.start, e - p.start) for x in p.layers[i]) for p, s, e in parts]
        kv = states[0] if len(states) == 1 else tuple(_joined([st[j] for st in states], 0) for j in range(2))
        return (*kv, *self.cache[i].state[2:])  # mlx-lm's KV state: (keys, values, offset, ...)

    def run_ends(self) -> list[int]:
        ends = []
        for prev, blk in zip(self._blocks, self._blocks[1:]):
            if blk.pack is not prev.pack:
                ends.append(blk.start)
        return ends

    def position_bytes(self) -> int:
        return _position_bytes(self._blocks[0].pack) if self._blocks else 0


class MemoryTier:
    """Snapshots in memory over shared blocks, an LRU under `budget_bytes` (see the module doc).

    Only the engine's worker thread reads arrays; the lock guards the bookkeeping, so statistics
    can be read from elsewhere.
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.env = compute_env()
        self._items: "OrderedDict[str, MemEntry]" = OrderedDict()
        self._blocks: dict[str, MemBlock] = {}
        self._users: dict[str, int] = {}  # block name -> snapshots naming it
        self._bytes = 0
        self._lock = threading.RLock()

    # -- store ----------------------------------------------------------------------------------
    def add(self, meta: SnapshotMeta, cache: Sequence[Any], owned: bool = False) -> SharedSnapshot:
        """Store the snapshot `meta` of `cache` (a live cache's layers: only the positions whose
        blocks are missing are copied; `owned`: `cache` is nobody else's, its arrays are kept
        as they are) and return it as the disk writer takes it. A snapshot larger than the
        budget is not kept, but returned all the same (the disk has its own budget)."""
        blocked = [rules_of(c).blocks and getattr(c, "keys", None) is not None for c in cache]
        names = block_keys(meta, self.env) if any(blocked) else []
        bounds = block_bounds(meta) if names else []
        with self._lock:
            have = 0
            while have < len(names) and names[have] in self._blocks:
                have += 1
            mine = [self._blocks[k] for k in names[:have]]
        blocks = list(mine)
        new = list(zip(bounds[have:], names[have:]))
        # A copy splits at the last exact cut: the decoded tail's pack goes when a later turn
        # makes it redundant. An owned cache is kept as it is, one pack (views of its buffers).
        cut = meta.length if owned else meta.canonical
        for group in ([x for x in new if x[0][1] <= cut], [x for x in new if x[0][1] > cut]):
            if not group:
                continue
            a, b = group[0][0][0], group[-1][0][1]
            layers: list[Optional[tuple[State, State]]] = []
            for c, bl in zip(cache, blocked):
                if not bl:
                    layers.append(None)
                    continue
                kv = tuple(sliced(x, a, b) for x in _kv_pair(c))
                layers.append(kv if owned else tuple(_owned(x) for x in kv))
            pack = MemPack(a, b, layers, sum(_nbytes(kv) for kv in layers if kv is not None))
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
                whole.append(c if owned else rules_of(c).clone(c))
        arrays = [a for blk in blocks[have:] for kv in blk.pack.layers if kv is not None for a in _arrays(kv)]
        mx.eval(arrays + cache_arrays([w for w in whole if w is not None]))
        entry = MemEntry(meta, names, templates, whole, sum(a.nbytes for a in cache_arrays([w for w in whole if w is not None])))
        shared = SharedSnapshot(meta, [t if t is not None else w for t, w in zip(templates, whole)], blocks)
        if meta.nbytes <= self.budget_bytes:
            with self._lock:
                for sid, other in list(self._items.items()):
                    if other.meta.model_key == meta.model_key and dominates(meta, other.meta):
                        self._drop(sid)
                self._insert(entry, blocks)
                while self._bytes > self.budget_bytes and len(self._items) > 1:
                    self._drop(next(iter(self._items)))
                if self._bytes > self.budget_bytes:
                    self._drop(next(iter(self._items)))
        return shared

    def _insert(self, entry: MemEntry, blocks: list[MemBlock]) -> None:
        old = self._items.pop(entry.meta.id, None)
        if old is not None:
            self._release(old)
        for blk in blocks:
            if blk.key not in self._blocks:
                self._blocks[blk.key] = blk
                if blk.pack.blocks == 0:
                    self._bytes += blk.pack.nbytes
                blk.pack.blocks += 1
        for k in entry.blocks:
            self._users[k] = self._users.get(k, 0) + 1
        self._bytes += entry.whole_bytes
        self._items[entry.meta.id] = entry

    def _release(self, entry: MemEntry) -> None:
        """Forget `entry`'s claim on its blocks; free the blocks (and packs) nobody names now."""
        self._bytes -= entry.whole_bytes
        for k in entry.blocks:
            left = self._users[k] - 1
            if left > 0:
                self._users[k] = left
                continue
            del self._users[k]
            blk = self._blocks.pop(k)
            blk.pack.blocks -= 1
            if blk.pack.blocks == 0:
                self._bytes -= blk.pack.nbytes

    def _drop(self, sid: str) -> None:
        self._release(self._items.pop(sid))

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
            blocks = [self._blocks[k] for k in entry.blocks]
        runs = _runs(blocks, n)
        out: list[Any] = []
        for i, (t, w) in enumerate(zip(entry.templates, entry.whole)):
            if t is not None:
                ready = spare[i] if spare is not None else None
                if ready is not None and ready.offset >= n:
                    ready.offset = n
                    out.append(ready)
                    continue
                parts = [tuple(sliced(x, s - p.start, e - p.start) for x in p.layers[i]) for p, s, e in runs]
                d = copy.copy(t)
                d.keys = _joined([p[0] for p in parts], GROW_ROOM)
                d.values = _joined([p[1] for p in parts], GROW_ROOM)
                d.offset = n
                out.append(d)
            else:
                out.append(whole_copy(w, n))
        mx.eval(cache_arrays(out))
        return out

    def cache_of(self, sid: str) -> list[Any]:
        """A new copy of snapshot `sid`'s whole state (tests compare its bits before and after)."""
        with self._lock:
            n = self._items[sid].meta.length
        return self.restore(sid, n)

    # -- statistics -----------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        with self._lock:
            named = sum(_position_bytes(b.pack) * (b.end - b.start)
                        for e in self._items.values() for b in (self._blocks[k] for k in e.blocks))
            unique = sum({id(b.pack): b.pack.nbytes for b in self._blocks.values()}.values())
            return {"entries": len(self._items), "bytes": self._bytes, "blocks": len(self._blocks),
                    "shared_bytes": max(0, named - unique)}
