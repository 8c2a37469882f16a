"""Snapshots: private, compact copies of a model's per-layer cache objects (mlx-lm classes).

A snapshot never hands out its arrays: a restore gets a copy (`clone_cache`), cut back with
mlx-lm's `trim_prompt_cache` when the planner says so. Taking one copies only the used part of
each buffer (KV buffers grow in steps of 256 tokens).
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
from mlx_lm.models.cache import KVCache, QuantizedKVCache

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
    def load(self, meta: SnapshotMeta) -> Snapshot: ...  # raises SnapshotError if bad
    def save_async(self, snapshot: Snapshot) -> None: ...
    def remove(self, snapshot_id: str) -> None: ...
    def clear(self) -> None: ...
    def stats(self) -> dict[str, Any]: ...
    def pop_warnings(self) -> list[str]: ...  # problems the user has not been told about yet
    def hold_writes(self) -> None: ...  # a generation runs: background writes wait
    def release_writes(self) -> None: ...


def cache_arrays(cache: Sequence[Any]) -> list[mx.array]:
    """Every array of every layer's state (mlx-lm states are trees with None for empty slots)."""
    return [v for c in cache for _, v in tree_flatten(c.state) if isinstance(v, mx.array)]


def cache_nbytes(cache: Sequence[Any]) -> int:
    """Bytes of the state a snapshot keeps (the used part of each buffer)."""
    return sum(a.nbytes for a in cache_arrays(cache))


def _slice_used(x: Any, n: int) -> Any:
    if isinstance(x, (list, tuple)):
        return type(x)(_slice_used(v, n) for v in x)
    return x[..., :n, :] if x is not None else None


def clone_cache(cache: Sequence[Any]) -> list[Any]:
    """A deep copy holding only the used part of each buffer (KV buffers grow in steps of 256)."""
    out = []
    for c in cache:
        if isinstance(c, (KVCache, QuantizedKVCache)) and c.keys is not None:
            d = copy.copy(c)
            d.keys = _slice_used(c.keys, c.offset)
            d.values = _slice_used(c.values, c.offset)
            # slicing is lazy; materialise so the copy owns its memory
            d.keys, d.values = copy.deepcopy(d.keys), copy.deepcopy(d.values)
            out.append(d)
        else:
            out.append(copy.deepcopy(c))
    mx.eval(cache_arrays(out))
    return out


def layer_offset(c: Any) -> Optional[int]:
    off = getattr(c, "offset", None)
    return int(off) if isinstance(off, int) else None


def describe_layers(cache: Sequence[Any]) -> list[LayerInfo]:
    return [
        LayerInfo(
            index=i,
            cache_class=type(c).__name__,
            offset=layer_offset(c),
            size=int(c.size()) if hasattr(c, "size") else 0,
            trimmable=bool(c.is_trimmable()),
        )
        for i, c in enumerate(cache)
    ]


def plain_kv(cache: Sequence[Any]) -> bool:
    """Plain KV caches can always be cut back; rings and SSM state cannot."""
    return all(isinstance(c, (KVCache, QuantizedKVCache)) for c in cache)
