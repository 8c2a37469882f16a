"""The prompt cache: snapshots of a model's cache, and the lookup that decides what to reuse.

A snapshot is a deep, compact copy of the per-layer cache objects after some token prefix.
Three kinds are taken per generation (DESIGN.md):

- ``pre-last``: right after prefill, the cache holds ``prompt[:-1]``. A regenerate of the same
  prompt restores exactly this and forwards the last prompt token alone (G4), never the
  whole prompt (the classic whole-prompt-hit bug).
- ``end``: prompt + reply, for the next turn (fast mode reuses decoded tokens).
- ``boundary``: for caches that cannot be cut back (wrapped sliding window, SSM state), a copy
  taken during prefill at the last aligned boundary ``floor((len-1)/C)*C``: what exact mode
  reuses on the next turn for those families.

Exactness bookkeeping: prefill chunks are cut at absolute multiples of ``C``. The state after
position ``p`` equals a cold run's state (bit for bit) when ``p`` is a multiple of ``C`` reached
through full aligned chunks only (``canonical``), or when ``p`` is where an exact prefill ended
(``prefill_end``) and the new prompt ends one token later too (a whole-prompt hit).
"""

from __future__ import annotations

import copy
import itertools
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, Sequence

import mlx.core as mx
from mlx_lm.models.cache import KVCache, QuantizedKVCache

from engine.errors import SnapshotError
from engine.types import LayerInfo

_ids = itertools.count(1)


def new_snapshot_id() -> str:
    return f"{int(time.time() * 1000):x}-{os.getpid():x}-{next(_ids):x}"


@dataclass
class SnapshotMeta:
    """Everything about a snapshot except its arrays (what the disk index keeps)."""

    id: str
    model_key: str
    tokens: tuple[int, ...]
    kind: str  # "pre-last" | "end" | "boundary" | "partial"
    canonical: int  # state at multiples of C up to here equals a cold run's
    prefill_end: int  # where this snapshot's prompt prefill ended (len(prompt) - 1)
    prefill_exact: bool  # state at prefill_end equals a cold run's
    classes: tuple[str, ...]
    trimmable: bool
    nbytes: int

    @property
    def length(self) -> int:
        return len(self.tokens)


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


# ---------------------------------------------------------------------------------------------
# Cache objects: copy, measure, describe, cut back


def _arrays(state: Any) -> list[mx.array]:
    out: list[mx.array] = []
    if isinstance(state, mx.array):
        out.append(state)
    elif isinstance(state, (list, tuple)):
        for s in state:
            out.extend(_arrays(s))
    return out


def cache_nbytes(cache: Sequence[Any]) -> int:
    return sum(a.nbytes for c in cache for a in _arrays(c.state))


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
    mx.eval([a for c in out for a in _arrays(c.state)])
    return out


def is_trimmable(cache: Sequence[Any]) -> bool:
    return all(c.is_trimmable() for c in cache)


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


def cut_reason(classes: Sequence[str], length: int, target: int) -> str:
    """Why a snapshot with these cache classes cannot be cut back from `length` to `target`."""
    if "ArraysCache" in classes:
        return f"SSM/conv state: cannot cut {length} -> {target}"
    if "RotatingKVCache" in classes:
        return f"sliding window wrapped: cannot cut {length} -> {target}"
    return f"cache cannot be cut back: {length} -> {target}"


def trim_cache(cache: Sequence[Any], n: int) -> None:
    for c in cache:
        c.trim(n)


# ---------------------------------------------------------------------------------------------
# Lookup


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass
class Plan:
    """What to restore: a snapshot cut back (or not) to `reuse` tokens."""

    meta: Optional[SnapshotMeta] = None
    source: Optional[str] = None
    reuse: int = 0
    matched: int = 0
    declines: list[str] = field(default_factory=list)


def exact_at(meta: SnapshotMeta, reuse: int, prompt_len: int, chunk: int) -> bool:
    """Does the snapshot's state after `reuse` tokens equal a cold run's, for a prompt of
    `prompt_len` tokens? (An aligned boundary reached in full chunks, or a whole-prompt hit on
    an exact prefill: see the module docstring.)"""
    return (
        reuse == 0
        or (reuse % chunk == 0 and reuse <= meta.canonical)
        or (meta.prefill_exact and reuse == meta.prefill_end == prompt_len - 1)
    )


def reuse_point(meta: SnapshotMeta, matched: int, prompt_len: int, mode: str, chunk: int) -> int:
    """The longest prefix of `meta` that may be restored for a prompt of `prompt_len` tokens.

    `matched` is the common prefix with the prompt, already capped at prompt_len - 1 so that
    the last prompt token is always forwarded, alone. Exact mode: the longest exact point.
    """
    if mode == "fast" or exact_at(meta, matched, prompt_len, chunk):
        return matched
    return min(matched // chunk * chunk, meta.canonical // chunk * chunk)


def plan_restore(
    candidates: Sequence[tuple[SnapshotMeta, str]],
    prompt: Sequence[int],
    mode: str,
    chunk: int,
) -> Plan:
    """Pick the snapshot giving the longest usable restore; say why better-matching ones lost."""
    limit = len(prompt) - 1
    head = list(prompt[:limit])
    options: list[tuple[int, int, SnapshotMeta, str, int, Optional[str]]] = []
    for meta, source in candidates:
        matched = common_prefix(meta.tokens, head)
        if matched == 0:
            continue
        reuse = reuse_point(meta, matched, len(prompt), mode, chunk)
        problem = None
        if reuse < meta.length and not meta.trimmable:
            problem = f"{meta.kind} snapshot: " + cut_reason(meta.classes, meta.length, reuse)
            usable = 0
        else:
            usable = reuse
        # Ties: memory before disk, then the smallest snapshot (least to copy and cut).
        options.append((usable, 1 if source == "memory" else 0, meta, source, matched, problem))
    plan = Plan()
    if not options:
        return plan
    options.sort(key=lambda o: (o[0], o[1], -o[2].length), reverse=True)
    best = options[0]
    if best[0] > 0:
        plan.meta, plan.source, plan.reuse = best[2], best[3], best[0]
    plan.matched = max(o[4] for o in options)
    for _, _, meta, _, matched, problem in options:
        if problem and matched > plan.reuse and meta is not plan.meta:
            plan.declines.append(problem)
    return plan


def dominates(a: SnapshotMeta, b: SnapshotMeta) -> bool:
    """True if `a` can serve every restore `b` could (so `b` may be dropped)."""
    if a.tokens == b.tokens and a.canonical >= b.canonical and a.prefill_exact >= b.prefill_exact:
        return True  # the same state again (a regenerate's snapshots): keep the newer copy
    if not a.trimmable or a.length < b.length or a.tokens[: b.length] != b.tokens:
        return False
    if a.canonical < b.canonical:
        return False
    if b.prefill_exact and not (a.prefill_exact and a.prefill_end == b.prefill_end):
        return False
    return True


# ---------------------------------------------------------------------------------------------
# The memory tier (with an optional disk tier behind it)


class PromptCache:
    """An LRU of snapshots under a byte budget, optionally written through to a disk tier.

    Only the engine's worker thread touches the arrays; the lock guards the bookkeeping so
    statistics can be read from elsewhere.
    """

    def __init__(self, budget_bytes: int = 2 << 30, disk: Optional[DiskTier] = None) -> None:
        self.budget_bytes = budget_bytes
        self.disk = disk
        self._items: "OrderedDict[str, Snapshot]" = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.lookups = 0
        self.hits = 0

    # -- store ----------------------------------------------------------------------------------
    def put(self, snapshot: Snapshot, persist: bool = True) -> None:
        meta = snapshot.meta
        if meta.length == 0 or meta.nbytes > self.budget_bytes:
            return
        with self._lock:
            for sid, other in list(self._items.items()):
                if other.meta.model_key == meta.model_key and dominates(meta, other.meta):
                    self._drop(sid)
            self._items[meta.id] = snapshot
            self._bytes += meta.nbytes
            while self._bytes > self.budget_bytes and self._items:
                self._drop(next(iter(self._items)))
        if persist and self.disk is not None:
            self.disk.save_async(snapshot)

    def _drop(self, sid: str) -> None:
        snap = self._items.pop(sid)
        self._bytes -= snap.meta.nbytes

    # -- lookup ---------------------------------------------------------------------------------
    def candidates(self, model_key: str) -> list[tuple[SnapshotMeta, str]]:
        with self._lock:
            mem = [(s.meta, "memory") for s in self._items.values() if s.meta.model_key == model_key]
        seen = {m.id for m, _ in mem}
        disk: list[tuple[SnapshotMeta, str]] = []
        if self.disk is not None:
            disk = [(m, "disk") for m in self.disk.entries(model_key) if m.id not in seen]
        return mem + disk

    def fetch(self, model_key: str, prompt: Sequence[int], mode: str, chunk: int) -> tuple[Plan, Optional[list[Any]]]:
        """Plan a restore and return (plan, a private copy of the cache cut to plan.reuse)."""
        self.lookups += 1
        declines: list[str] = []
        excluded: set[str] = set()
        while True:
            cands = [c for c in self.candidates(model_key) if c[0].id not in excluded]
            plan = plan_restore(cands, prompt, mode, chunk)
            plan.declines = declines + plan.declines
            if plan.meta is None:
                return plan, None
            try:
                snap = self._get(plan.meta, plan.source)
            except SnapshotError as e:
                declines.append(f"{plan.source} snapshot {plan.meta.id} unusable: {e}")
                excluded.add(plan.meta.id)
                if self.disk is not None:
                    self.disk.remove(plan.meta.id)
                continue
            cache = clone_cache(snap.cache)
            cut = plan.meta.length - plan.reuse
            if cut:
                trim_cache(cache, cut)
            self.hits += 1
            return plan, cache

    def _get(self, meta: SnapshotMeta, source: Optional[str]) -> Snapshot:
        with self._lock:
            snap = self._items.get(meta.id)
            if snap is not None:
                self._items.move_to_end(meta.id)
                return snap
        if source == "disk" and self.disk is not None:
            snap = self.disk.load(meta)
            snap.source = "disk"
            self.put(snap, persist=False)  # promote to memory
            return snap
        raise SnapshotError("evicted")

    # -- housekeeping ---------------------------------------------------------------------------
    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0
        if self.disk is not None:
            self.disk.clear()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = {
                "memory_entries": len(self._items),
                "memory_bytes": self._bytes,
                "memory_budget_bytes": self.budget_bytes,
                "lookups": self.lookups,
                "hits": self.hits,
            }
        if self.disk is not None:
            out.update({f"disk_{k}": v for k, v in self.disk.stats().items()})
        return out

    def metas(self) -> list[SnapshotMeta]:
        with self._lock:
            return [s.meta for s in self._items.values()]
