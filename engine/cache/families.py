"""Each mlx-lm cache class's rules, in one table keyed by class.

For every per-layer cache class a model can build (`make_prompt_cache`), `RULES` says:

- whether a layer of it can be cut back to any shorter length (`trimmable`), and how (`cut`);
- what a snapshot copies of it (`clone`: only the used part of a growing KV buffer);
- whether the disk tier writes it and how it comes back (`persist`, `restore`: `from_state`);
- its offset, the tokens it has seen (`offset`: None for state without positions);
- why a snapshot holding it cannot be cut back (`no_cut`, the planner's decline);
- what it becomes when the engine quantizes the KV cache (`quantized`);
- whether its state is a run of positions stored in shared blocks (`blocks`, blocks.py).

Lookups go by exact class (`rules_of`) or by the class name stored in snapshot metadata
(`rules_named`). A class not in the table (a subclass, a model's own cache) gets `_fallback`
rules: never written to disk, copied whole, cut back only as mlx-lm's `is_trimmable` allows.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional, Sequence

import mlx.core as mx
from mlx_lm.models.cache import (
    ArraysCache,
    CacheList,
    ChunkedKVCache,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
)

from engine.errors import SnapshotError

GENERIC_NO_CUT = "cache cannot be cut back"
CanCut = Literal["always", "sometimes", "never"]


@dataclass(frozen=True)
class CacheRules:
    """What the prompt cache does with one cache class (see the module doc)."""

    cls: type
    can_cut: CanCut  # "always": whatever it holds ("plain KV"); "sometimes": see `trimmable`
    trimmable: Callable[[Any], bool]  # this layer, as it is now, can be cut back to any length
    offset: Callable[[Any], Optional[int]]  # tokens this layer has seen; None: no positions (SSM)
    clone: Callable[[Any], Any]  # a copy that owns its arrays (lazy: the caller evaluates them)
    persist: bool  # its `.state` is arrays and scalars that `from_state` rebuilds: the disk tier keeps it
    no_cut: str  # why a snapshot holding it cannot be cut back
    quantized: Optional[Callable[[int, int], Any]] = None  # (group_size, bits) -> a new empty cache
    # Its state is a run of positions (every array's axis -2, `offset` long): stored in blocks
    # shared between snapshots (engine/cache/blocks.py). Else each snapshot keeps it whole.
    blocks: bool = False

    @property
    def name(self) -> str:
        """The class's name as snapshot metadata and the disk index store it."""
        return self.cls.__name__

    def cut(self, c: Any, n: int) -> None:
        """Drop the last `n` tokens of layer `c`; SnapshotError if it is not `trimmable` now."""
        if not self.trimmable(c):
            raise SnapshotError(f"{self.name} cannot be cut back ({self.no_cut})")
        if n and c.trim(n) != n:
            raise SnapshotError(f"{self.name} holds fewer than the {n} tokens to cut")

    def restore(self, state: Any) -> Any:
        """Rebuild a layer from its `.state` as the disk tier read it back."""
        if not self.persist:
            raise SnapshotError(f"{self.name} is not read back from disk")
        return self.cls.from_state(state)


def _int_offset(c: Any) -> Optional[int]:
    off = getattr(c, "offset", None)
    return int(off) if isinstance(off, int) else None


def _no_offset(c: Any) -> Optional[int]:
    return None


def _copy_used(x: Any, n: int) -> Any:
    """`x[..., :n, :]` in new memory (`mx.array` copies; `copy.deepcopy` of an MLX array shares
    its buffer, so the live cache's next write would copy the whole buffer instead)."""
    if isinstance(x, (list, tuple)):
        return type(x)(_copy_used(v, n) for v in x)
    return mx.array(x[..., :n, :]) if x is not None else None


def _clone_kv_buffer(c: Any) -> Any:
    """A copy holding only `keys[..., :offset, :]` (KV buffers grow in steps of 256 tokens)."""
    if c.keys is None:
        return copy.deepcopy(c)
    d = copy.copy(c)
    d.keys = _copy_used(c.keys, c.offset)
    d.values = _copy_used(c.values, c.offset)
    return d


def _kv_quantized(group_size: int, bits: int) -> Any:
    return QuantizedKVCache(group_size=group_size, bits=bits)


def _list_trimmable(c: Any) -> bool:
    return all(rules_of(part).trimmable(part) for part in c.caches)


def _always(c: Any) -> bool:
    return True


def _never(c: Any) -> bool:
    return False


_TABLE = (
    # A growing buffer of keys and values: cut back by lowering the offset.
    CacheRules(KVCache, can_cut="always", trimmable=_always, offset=_int_offset, clone=_clone_kv_buffer,
               persist=True, no_cut=GENERIC_NO_CUT, quantized=_kv_quantized, blocks=True),
    # The same, quantized (keys and values are (packed, scales, biases) triples).
    CacheRules(QuantizedKVCache, can_cut="always", trimmable=_always, offset=_int_offset, clone=_clone_kv_buffer,
               persist=True, no_cut=GENERIC_NO_CUT, blocks=True),
    # A sliding window: once it has wrapped, the tokens it overwrote are gone.
    CacheRules(RotatingKVCache, can_cut="sometimes", trimmable=lambda c: c.offset < c.max_size,
               offset=_int_offset, clone=copy.deepcopy, persist=True, no_cut="sliding window wrapped"),
    # SSM / convolution state (Mamba, LFM2): a running summary of every token, never cut back.
    CacheRules(ArraysCache, can_cut="never", trimmable=_never, offset=_no_offset, clone=copy.deepcopy,
               persist=True, no_cut="SSM/conv state"),
    # Chunked attention (Llama 4): it drops the tokens before `start_position`, so it can be cut
    # back only while it has dropped none (mlx-lm's trim stops there silently). Not on disk yet.
    CacheRules(ChunkedKVCache, can_cut="sometimes", trimmable=lambda c: c.start_position == 0,
               offset=_int_offset, clone=copy.deepcopy, persist=False, no_cut="attention chunk moved on"),
    # Several caches for one layer: cut back when every part can be. Its state names the parts'
    # classes, which `from_state` looks up by name: never rebuilt from disk.
    CacheRules(CacheList, can_cut="sometimes", trimmable=_list_trimmable, offset=_no_offset,
               clone=copy.deepcopy, persist=False, no_cut=GENERIC_NO_CUT),
)
RULES: dict[type, CacheRules] = {r.cls: r for r in _TABLE}
_BY_NAME: dict[str, CacheRules] = {r.name: r for r in RULES.values()}


def _mlx_lm_trimmable(c: Any) -> bool:
    return bool(c.is_trimmable()) if hasattr(c, "is_trimmable") else False


def _fallback(cls: type) -> CacheRules:
    return CacheRules(cls, can_cut="sometimes", trimmable=_mlx_lm_trimmable, offset=_int_offset,
                      clone=copy.deepcopy, persist=False, no_cut=GENERIC_NO_CUT)


def rules_of(c: Any) -> CacheRules:
    """The rules of layer `c`'s class (exact class; anything else gets the fallback rules)."""
    return RULES.get(type(c)) or _fallback(type(c))


def rules_named(name: str) -> Optional[CacheRules]:
    """The rules of the class stored under `name` in snapshot metadata; None if not in the table."""
    return _BY_NAME.get(name)


def persisted(name: str) -> bool:
    """Does the disk tier write (and rebuild) layers of the class named `name`?"""
    r = _BY_NAME.get(name)
    return r is not None and r.persist


def class_names(cache: Sequence[Any]) -> tuple[str, ...]:
    """Each layer's class name, as snapshot metadata records it."""
    return tuple(rules_of(c).name for c in cache)


def layer_offset(c: Any) -> Optional[int]:
    """Tokens layer `c` has seen; None for a layer without positions (SSM / conv state)."""
    return rules_of(c).offset(c)


def trimmable(cache: Sequence[Any]) -> bool:
    """Can every layer, as it is now, be cut back to any shorter length?"""
    return all(rules_of(c).trimmable(c) for c in cache)


def always_trimmable(cache: Sequence[Any]) -> bool:
    """Is every layer of a class that can always be cut back (plain and quantized KV)?"""
    return all(rules_of(c).can_cut == "always" for c in cache)


def cut_back(cache: Sequence[Any], n: int) -> None:
    """Drop the last `n` tokens of every layer; SnapshotError if a layer cannot be cut back."""
    if n:
        for c in cache:
            rules_of(c).cut(c, n)


def clone_layers(cache: Sequence[Any]) -> list[Any]:
    """A copy of each layer that will own its arrays (lazy: the caller evaluates them)."""
    return [rules_of(c).clone(c) for c in cache]


def quantized_cache(cache: Sequence[Any], group_size: int, bits: int) -> list[Any]:
    """A new cache with KV quantization on: each layer whose class has a quantized form gets it."""
    out = []
    for c in cache:
        q = rules_of(c).quantized
        out.append(q(group_size, bits) if q is not None else c)
    return out


def cut_reason(classes: Sequence[str], length: int, target: int) -> str:
    """Why a snapshot with these layer classes cannot be cut back from `length` to `target`:
    a class that can never be cut back names the reason first, then one that sometimes cannot."""
    present = [r for r in RULES.values() if r.name in classes and r.no_cut != GENERIC_NO_CUT]
    present.sort(key=lambda r: r.can_cut != "never")  # stable: table order otherwise
    if present:
        return f"{present[0].no_cut}: cannot cut {length} -> {target}"
    return f"{GENERIC_NO_CUT}: {length} -> {target}"
