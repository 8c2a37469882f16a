"""Snapshots: private, compact copies of a model's per-layer cache objects (mlx-lm classes).

A snapshot never hands out its arrays: a restore gets a copy (`clone_cache`), cut back
(`families.cut_back`) when the planner says so. What a copy of each layer holds, and whether
it can be cut back, is its class's rule in engine/cache/families.py.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

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


def clone_cache(cache: Sequence[Any]) -> list[Any]:
    """A deep copy that owns its memory, evaluated (KV buffers: only the used part)."""
    out = clone_layers(cache)
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
