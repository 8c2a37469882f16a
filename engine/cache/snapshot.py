"""Snapshots: private, compact copies of a model's per-layer cache objects (mlx-lm classes).

A snapshot never hands out its arrays: a restore gets a copy (`restore_copy`), cut back
(`families.cut_back`) when the planner says so, or the spare copied after the reply that
stored it (`spare_layers`), so a regenerate copies nothing before its first forward. What a copy of each layer holds, and whether
it can be cut back, is its class's rule in engine/cache/families.py.
"""

from __future__ import annotations

import copy
import itertools
import os
import time
from dataclasses import dataclass
from typing import Any, Optional, Protocol, Sequence

import mlx.core as mx
from mlx.utils import tree_flatten

from engine.cache.families import clone_layers, rules_of
from engine.cache.planner import SnapshotMeta
from engine.types import LayerInfo

_ids = itertools.count(1)


def new_snapshot_id() -> str:
    return f"{int(time.time() * 1000):x}-{os.getpid():x}-{next(_ids):x}"


@dataclass
class Snapshot:
    meta: SnapshotMeta
    cache: list[Any]  # mlx-lm cache objects; never handed out, only copies of them
    source: str = "memory"


class DiskTier(Protocol):
    """What the prompt cache needs from a persistent tier (engine/cache/disk/)."""

    def entries(self, model_key: str) -> list[SnapshotMeta]: ...
    def load(self, meta: SnapshotMeta, upto: Optional[int] = None) -> Snapshot: ...  # SnapshotError if bad
    def save_async(self, snapshot: Snapshot) -> None: ...
    def remove(self, snapshot_id: str) -> None: ...
    def clear(self) -> None: ...
    def stats(self) -> dict[str, Any]: ...
    def pop_warnings(self) -> list[str]: ...  # problems the user has not been told about yet
    def hold_writes(self) -> None: ...  # a generation runs: background writes wait (bounded)
    def release_writes(self) -> None: ...


def cache_arrays(cache: Sequence[Any]) -> list[mx.array]:
    """Every array of every layer's state (mlx-lm states are trees with None for empty slots)."""
    return [v for c in cache for _, v in tree_flatten(c.state) if isinstance(v, mx.array)]


def cache_nbytes(cache: Sequence[Any]) -> int:
    """Bytes of the state a snapshot keeps (the used part of each buffer)."""
    return sum(a.nbytes for a in cache_arrays(cache))


def clone_cache(cache: Sequence[Any]) -> list[Any]:
    """A deep copy that owns its memory, evaluated (KV buffers: only the used part)."""
    out = clone_layers(cache)
    mx.eval(cache_arrays(out))
    return out


GROW_ROOM = 256  # positions of room a restored KV buffer gets (mlx-lm's KVCache.step)


def _with_room(x: Any, n: int, room: int) -> Any:
    if isinstance(x, mx.array):
        pad = mx.zeros((*x.shape[:-2], room, x.shape[-1]), dtype=x.dtype)
        return mx.concatenate([x[..., :n, :], pad], axis=-2)
    if isinstance(x, (list, tuple)):
        return type(x)(_with_room(v, n, room) for v in x)
    return x


def spare_layers(cache: Sequence[Any]) -> list[Any]:
    """A private copy of the live cache's layers kept in blocks, with room to grow (None for the
    other layers: a restore copies those from the snapshot). Lazy: the caller starts it in the
    background (`mx.async_eval`) so a reply ends without waiting for it. New buffers (a
    concatenation), never views: an end snapshot's arrays are views of the live buffer."""
    out: list[Any] = []
    for c in cache:
        if rules_of(c).blocks and getattr(c, "keys", None) is not None:
            d = copy.copy(c)
            d.keys = _with_room(c.keys, c.offset, GROW_ROOM)
            d.values = _with_room(c.values, c.offset, GROW_ROOM)
            out.append(d)
        else:
            out.append(None)
    return out


def restore_copy(cache: Sequence[Any], n: int, spare: Optional[Sequence[Any]] = None) -> list[Any]:
    """A private copy of a snapshot's layers holding its first `n` tokens, for a generation to
    continue from: layers kept in blocks (KV, quantized KV) get one new buffer of the first `n`
    positions with room to grow (the first forward writes into it in place instead of copying it
    again to grow it), never a view of the snapshot's arrays; other layers are copied whole and
    cut back (families.cut_back raises SnapshotError where they cannot be). `spare`: the same
    snapshot's layers already copied off the critical path (`spare_layers`); a block layer of it
    holding at least `n` tokens is handed over as it is, cut back to `n` (what lies past the
    offset is never read), so no copy stands between the request and its first forward."""
    out = []
    for i, c in enumerate(cache):
        rules = rules_of(c)
        if rules.blocks and getattr(c, "keys", None) is not None:
            ready = spare[i] if spare is not None else None
            if ready is not None and ready.offset >= n:
                ready.offset = n
                out.append(ready)
                continue
            d = copy.copy(c)
            d.keys = _with_room(c.keys, n, GROW_ROOM)
            d.values = _with_room(c.values, n, GROW_ROOM)
            d.offset = n
            out.append(d)
        else:
            d = rules.clone(c)
            off = rules.offset(c)
            if off is not None and off > n:
                rules.cut(d, off - n)
            out.append(d)
    mx.eval(cache_arrays(out))
    return out


def describe_layers(cache: Sequence[Any]) -> list[LayerInfo]:
    """Each layer's class, offset, size and whether it can be cut back now (the debug panel's table)."""
    out = []
    for i, c in enumerate(cache):
        rules = rules_of(c)
        size = int(c.size()) if hasattr(c, "size") else 0
        out.append(LayerInfo(index=i, cache_class=rules.name, offset=rules.offset(c), size=size,
                             trimmable=rules.trimmable(c)))
    return out
