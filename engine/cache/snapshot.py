"""Snapshots: private, compact copies of a model's per-layer cache objects (mlx-lm classes).

A snapshot never hands out its arrays: a restore gets a copy (the memory tier's `restore`, or
`restore_copy` for a snapshot read from disk that the memory budget cannot hold), cut back
(`families.cut_back`) when the planner says so. What a copy of each layer holds, and whether it
can be cut back, is its class's rule in engine/cache/families.py.
"""

from __future__ import annotations

import copy
import itertools
import os
import time
from dataclasses import dataclass
from typing import Any, Sequence

import mlx.core as mx
from mlx.utils import tree_flatten

from engine.cache.families import clone_layers, rules_of
from engine.cache.blocks import in_blocks, layers_in_blocks
from engine.cache.meta import SnapshotMeta
from engine.types import LayerInfo

_ids = itertools.count(1)


def new_snapshot_id() -> str:
    return f"{int(time.time() * 1000):x}-{os.getpid():x}-{next(_ids):x}"


@dataclass
class Snapshot:
    meta: SnapshotMeta
    cache: list[Any]  # mlx-lm cache objects; never handed out, only copies of them

    # What the disk writer reads (block_state.SharedSnapshot keeps the positions in blocks):
    def span_state(self, i: int, a: int, b: int) -> Any:
        """Layer `i`'s state for positions [a, b) (a layer kept in blocks); lazy views."""
        return sliced(self.cache[i].state, a, b)

    def layers_in_blocks(self) -> list[bool]:
        """Per layer: kept in blocks (else whole); the one definition is engine/cache/blocks.py (in_blocks)."""
        return layers_in_blocks(self.cache)

    def run_ends(self) -> list[int]:
        """Positions where the block layers' storage changes buffer (a disk pack never crosses one)."""
        return []

    def full_cache(self) -> list[Any]:
        """Its layers, every position in them (a snapshot of blocks joins them)."""
        return self.cache

    def position_bytes(self) -> int:
        """Bytes one position takes in the layers kept in blocks."""
        total = 0
        for c in self.cache:
            if in_blocks(c):
                for v in cache_arrays([c]):
                    total += v.nbytes // max(1, v.shape[-2])
        return total


def sliced(x: Any, a: int, b: int) -> Any:
    """A layer state's positions [a, b) (axis -2 of every array in it): lazy views."""
    if isinstance(x, mx.array):
        return x[..., a:b, :]
    if isinstance(x, (list, tuple)):
        return type(x)(sliced(v, a, b) for v in x)
    return x


def cache_arrays(cache: Sequence[Any]) -> list[mx.array]:
    """Every array of every layer's state (mlx-lm states are trees with None for empty slots)."""
    return [v for c in cache for _, v in tree_flatten(c.state) if isinstance(v, mx.array)]


def cache_nbytes(cache: Sequence[Any]) -> int:
    """Bytes of the state a snapshot keeps: the used positions of a KV buffer (mlx-lm's `.state`
    is the whole buffer, room to grow included), every array of the other layers."""
    total = 0
    for c in cache:
        if in_blocks(c):
            total += sum(a.nbytes * c.offset // max(1, a.shape[-2]) for a in cache_arrays([c]) if a.ndim >= 2)
        else:
            total += sum(a.nbytes for a in cache_arrays([c]))
    return total


def clone_cache(cache: Sequence[Any]) -> list[Any]:
    """A deep copy that owns its memory, evaluated (KV buffers: only the used part)."""
    out = clone_layers(cache)
    mx.eval(cache_arrays(out))
    return out


GROW_ROOM = 256  # positions of room a restored KV buffer gets (mlx-lm's KVCache.step)


def joined(parts: list[Any], room: int) -> Any:
    """Layer states' positions joined along axis -2 in one new buffer, with `room` zero positions after."""
    first = parts[0]
    if isinstance(first, mx.array):
        pad = [mx.zeros((*first.shape[:-2], room, first.shape[-1]), dtype=first.dtype)] if room else []
        return mx.concatenate([*parts, *pad], axis=-2)
    return type(first)(joined([p[i] for p in parts], room) for i in range(len(first)))


def restore_copy(cache: Sequence[Any], n: int) -> list[Any]:
    """A private copy of a snapshot's layers holding its first `n` tokens, for a generation to
    continue from: layers kept in blocks (KV, quantized KV) get one new buffer of the first `n`
    positions with room to grow (the first forward writes into it in place instead of copying it
    again to grow it), never a view of the snapshot's arrays; other layers are copied whole and
    cut back (families.cut_back raises SnapshotError where they cannot be)."""
    out = []
    for c in cache:
        rules = rules_of(c)
        if in_blocks(c):
            keys, values = (joined([sliced(x, 0, n)], GROW_ROOM) for x in (c.keys, c.values))
            out.append(with_kv(c, keys, values, n))
        else:
            out.append(whole_copy(c, n))
    mx.eval(cache_arrays(out))
    return out


def with_kv(layer: Any, keys: Any, values: Any, n: int) -> Any:
    """A shallow copy of KV layer `layer` holding `keys` and `values`, `n` of their positions used."""
    d = copy.copy(layer)
    d.keys, d.values, d.offset = keys, values, n
    return d


def whole_copy(c: Any, n: int) -> Any:
    """A copy of a layer not kept in blocks, cut back to `n` tokens where it holds more
    (families.cut_back's rule: SnapshotError where it cannot be cut)."""
    rules = rules_of(c)
    d = rules.clone(c)
    off = rules.offset(c)
    if off is not None and off > n:
        rules.cut(d, off - n)
    return d


def describe_layers(cache: Sequence[Any]) -> list[LayerInfo]:
    """Each layer's class, offset, size and whether it can be cut back now (the debug panel's table)."""
    out = []
    for i, c in enumerate(cache):
        rules = rules_of(c)
        size = int(c.size()) if hasattr(c, "size") else 0
        out.append(LayerInfo(index=i, cache_class=rules.name, offset=rules.offset(c), size=size,
                             trimmable=rules.trimmable(c)))
    return out
