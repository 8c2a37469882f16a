"""The state of blocks in memory, shared by the memory tier and the disk tier.

A `MemPack` holds positions [start, end) of every layer kept in blocks (engine/cache/blocks.py)
in buffers of its own (a memory tier's copy of one save's new positions, or the arrays of a pack
file as read); a `MemBlock` is a named span of one pack; a `MemEntry` is a snapshot in memory (its
blocks' names, its whole layers). A `SharedSnapshot` is a snapshot made of blocks as the disk
writer reads it (`span_state`: slices of the packs) and as the disk tier hands a read back to
the memory tier (no join: the memory tier's restore joins once, with room to grow).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import mlx.core as mx
from mlx.utils import tree_flatten

from engine.cache.meta import SnapshotMeta
from engine.cache.snapshot import Snapshot, cache_arrays, joined, sliced

State = Any  # a layer's state: an array, or a tuple of them (quantized KV: (packed, scales, biases))


def block_arrays(x: State) -> list[mx.array]:
    return [v for _, v in tree_flatten(x) if isinstance(v, mx.array)]


def state_nbytes(x: State) -> int:
    return sum(a.nbytes for a in block_arrays(x))


def owned_copy(x: State) -> State:
    """A copy in new memory (`mx.array` copies; `copy.deepcopy` would share the buffer)."""
    if isinstance(x, mx.array):
        return mx.array(x)
    if isinstance(x, (list, tuple)):
        return type(x)(owned_copy(v) for v in x)
    return x


def kv_pair(c: Any) -> tuple[State, State]:
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
    n_blocks: int = 0  # blocks of it still named by a snapshot


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
    block_names: list[str]
    templates: list[Any]  # per layer: an empty copy of the layer object (block layers) or None
    whole: list[Any]  # per layer: the whole layer's private clone (layers not in blocks) or None
    whole_bytes: int


def runs_of(blocks: Sequence[MemBlock], n: int) -> list[tuple[MemPack, int, int]]:
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


def position_bytes(pack: MemPack) -> int:
    """Bytes one position takes in the block layers."""
    return sum(a.nbytes // max(1, a.shape[-2]) for kv in pack.layers if kv is not None for a in block_arrays(kv))


class SharedSnapshot(Snapshot):
    """A snapshot made of memory blocks, as the disk writer sees it: `span_state` slices the pack
    holding the positions (the writer's packs never cross `run_ends`, so no join is needed), the
    whole layers are the entry's clones. Read-only: nothing writes into these arrays."""

    def __init__(self, meta: SnapshotMeta, cache: list[Any], blocks: list[MemBlock],
                 blocked: Optional[list[bool]] = None) -> None:
        super().__init__(meta, cache)
        self._blocks = blocks
        # Which layers are in blocks was decided once (engine/cache/blocks.py: in_blocks) by whoever built it:
        # a template and a KV layer kept whole both have keys=None, so it cannot be derived again.
        self._blocked = blocked if blocked is not None else [
            bool(blocks) and blocks[0].pack.layers[i] is not None for i in range(len(cache))]

    def layers_in_blocks(self) -> list[bool]:
        return list(self._blocked)

    def span_state(self, i: int, a: int, b: int) -> Any:
        parts = [(p, s, e) for p, s, e in runs_of(self._blocks, b) if e > a]
        parts = [(p, max(a, s), e) for p, s, e in parts]
        states = [tuple(sliced(x, s - p.start, e - p.start) for x in p.layers[i]) for p, s, e in parts]
        kv = states[0] if len(states) == 1 else tuple(joined([st[j] for st in states], 0) for j in range(2))
        return (*kv, *self.cache[i].state[2:])  # mlx-lm's KV state: (keys, values, offset, ...)

    def run_ends(self) -> list[int]:
        ends = []
        for prev, blk in zip(self._blocks, self._blocks[1:]):
            if blk.pack is not prev.pack:
                ends.append(blk.start)
        return ends

    def position_bytes(self) -> int:
        return position_bytes(self._blocks[0].pack) if self._blocks else 0

    @property
    def blocks(self) -> list[MemBlock]:
        return list(self._blocks)

    def full_cache(self) -> list[Any]:
        """Its layers with the block layers' positions joined (new buffers, evaluated)."""
        out = []
        for i, c in enumerate(self.cache):
            if self._blocked[i]:
                d = copy.copy(c)
                k, v, *_ = self.span_state(i, 0, self.meta.length)
                d.keys, d.values = joined([k], 0), joined([v], 0)
                out.append(d)
            else:
                out.append(c)
        mx.eval(cache_arrays(out))
        return out


