"""Each row of the cache-class table (engine/cache/families.py), on real mlx-lm cache objects:
whether it can be cut back, cutting it, its offset, what a snapshot copies, and whether the disk
tier writes it and rebuilds the same state. No model: each layer is filled with random keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models.cache import (
    ArraysCache,
    CacheList,
    ChunkedKVCache,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
)

from engine.cache import families as fam
from engine.cache.disk.tier import DiskCache
from engine.cache.meta import SnapshotMeta
from engine.cache.snapshot import Snapshot, cache_nbytes, clone_cache, describe_layers, new_snapshot_id
from engine.errors import SnapshotError
from tests.tiny_models import FAMILIES, build_model


def fill(c: Any, n: int, one_by_one: bool = False) -> Any:
    """Feed `n` tokens of random keys and values to an attention cache layer."""
    widths = [1] * n if one_by_one else [n]
    for w in widths:
        c.update_and_fetch(mx.random.normal((1, 2, w, 64)), mx.random.normal((1, 2, w, 64)))
    mx.eval([v for _, v in tree_flatten(c.state) if isinstance(v, mx.array)])
    return c


def same_state(a: Any, b: Any) -> bool:
    fa, fb = tree_flatten(a.state), tree_flatten(b.state)
    if [k for k, _ in fa] != [k for k, _ in fb]:
        return False
    for (_, x), (_, y) in zip(fa, fb):
        if isinstance(x, mx.array) != isinstance(y, mx.array):
            return False
        if isinstance(x, mx.array) and not (x.shape == y.shape and mx.array_equal(x, y).item()):
            return False
        if not isinstance(x, mx.array) and x != y:
            return False
    return True


def disk_roundtrip(root: Path, cache: list[Any], length: int) -> Optional[list[Any]]:
    """Save `cache` as a snapshot of `length` tokens through the disk tier and load it back
    (None if the tier skipped it: a class it does not write)."""
    snap_cache = clone_cache(cache)
    meta = SnapshotMeta(new_snapshot_id(), "k" * 32, tuple(range(length)), "end", (), fam.class_names(cache),
                        fam.trimmable(snap_cache), cache_nbytes(snap_cache))
    disk = DiskCache(root, budget_bytes=1 << 30)
    try:
        disk.save_async(Snapshot(meta, snap_cache))
        assert disk.flush(60)
        if disk.stats()["skipped"]:
            assert disk.entries("k" * 32) == []
            return None
        [stored] = disk.entries("k" * 32)
        return disk.load(stored).full_cache()
    finally:
        disk.close(10)


def test_kv_cache_can_always_be_cut_and_a_snapshot_copies_only_the_used_part(tmp_path: Path) -> None:
    c = fill(KVCache(), 5)
    rules = fam.rules_of(c)
    assert rules.cls is KVCache and rules.can_cut == "always" and rules.trimmable(c) and rules.persist
    assert fam.layer_offset(c) == 5 and c.keys.shape[2] == 256  # the buffer grows in steps of 256
    copy = clone_cache([c])[0]
    assert copy.keys.shape[2] == copy.values.shape[2] == 5 and copy.offset == 5
    assert mx.array_equal(copy.keys, c.keys[..., :5, :]).item()
    back = disk_roundtrip(tmp_path, [c], 5)
    assert back is not None and same_state(back[0], copy)
    fam.cut_back([copy], 2)
    assert fam.layer_offset(copy) == 3 and c.offset == 5  # the copy is cut, never the original
    with pytest.raises(SnapshotError):
        fam.cut_back([copy], 4)  # more than it holds
    q = fam.quantized_cache([KVCache()], 64, 8)[0]  # KV quantization turns it into its quantized form
    assert type(q) is QuantizedKVCache and (q.group_size, q.bits) == (64, 8)


def test_quantized_kv_cache_can_always_be_cut_and_copies_each_part_to_the_used_length(tmp_path: Path) -> None:
    c = fill(QuantizedKVCache(group_size=64, bits=8), 7)
    rules = fam.rules_of(c)
    assert rules.can_cut == "always" and rules.trimmable(c) and rules.persist and rules.quantized is None
    copy = clone_cache([c])[0]
    assert all(part.shape[2] == 7 for part in (*copy.keys, *copy.values)) and c.keys[0].shape[2] == 256
    back = disk_roundtrip(tmp_path, [c], 7)
    assert back is not None and same_state(back[0], copy)
    fam.cut_back([copy], 3)
    assert fam.layer_offset(copy) == 4
    assert fam.quantized_cache([c], 64, 4)[0] is c  # already quantized: kept as it is


def test_rotating_kv_cache_can_be_cut_until_its_window_wraps(tmp_path: Path) -> None:
    ring = fill(RotatingKVCache(max_size=8), 5, one_by_one=True)
    rules = fam.rules_of(ring)
    assert rules.can_cut == "sometimes" and rules.trimmable(ring) and ring.is_trimmable()
    wrapped = fill(RotatingKVCache(max_size=8), 12, one_by_one=True)
    assert fam.layer_offset(wrapped) == 12 and wrapped.size() == 8  # the offset counts every token seen
    assert not rules.trimmable(wrapped) and not wrapped.is_trimmable()  # mlx-lm agrees
    assert not fam.trimmable([KVCache(), wrapped]) and fam.trimmable([KVCache(), ring])
    with pytest.raises(SnapshotError, match="sliding window wrapped"):
        fam.cut_back([wrapped], 1)
    assert fam.cut_reason(["KVCache", "RotatingKVCache"], 12, 5) == "sliding window wrapped: cannot cut 12 -> 5"
    back = disk_roundtrip(tmp_path, [wrapped], 12)
    assert back is not None and same_state(back[0], wrapped) and not fam.trimmable(back)
    fam.cut_back([ring], 2)
    assert fam.layer_offset(ring) == 3


def test_arrays_cache_ssm_state_is_never_cut_and_has_no_offset(tmp_path: Path) -> None:
    ssm = ArraysCache(size=2)
    ssm[0], ssm[1] = mx.random.normal((1, 3, 16)), mx.random.normal((1, 4, 4))
    rules = fam.rules_of(ssm)
    assert rules.can_cut == "never" and not rules.trimmable(ssm) and fam.layer_offset(ssm) is None
    with pytest.raises(SnapshotError, match="SSM/conv state"):
        fam.cut_back([ssm], 1)
    # a model with both: the state that can never be cut back is the reason given
    assert fam.cut_reason(["RotatingKVCache", "ArraysCache", "KVCache"], 9, 4) == "SSM/conv state: cannot cut 9 -> 4"
    back = disk_roundtrip(tmp_path, [ssm, fill(KVCache(), 6)], 6)
    assert back is not None and same_state(back[0], ssm) and type(back[0]) is ArraysCache
    [info] = describe_layers([ssm])
    assert (info.cache_class, info.offset, info.trimmable) == ("ArraysCache", None, False)


def test_chunked_kv_cache_is_cut_only_while_it_has_dropped_nothing_and_stays_off_disk(tmp_path: Path) -> None:
    c = fill(ChunkedKVCache(chunk_size=4), 3)
    rules = fam.rules_of(c)
    assert rules.can_cut == "sometimes" and rules.trimmable(c) and not rules.persist
    moved = fill(ChunkedKVCache(chunk_size=4), 6)
    moved.maybe_trim_front()  # the chunk moved on: tokens 0 and 1 are gone
    assert moved.start_position == 2 and moved.is_trimmable()  # mlx-lm says yes, then trims less than asked
    assert not rules.trimmable(moved)
    with pytest.raises(SnapshotError, match="attention chunk moved on"):
        fam.cut_back([moved], 5)
    assert disk_roundtrip(tmp_path, [c], 3) is None  # not written: the tier counts it as skipped
    with pytest.raises(SnapshotError):
        rules.restore(c.state)


def test_cache_list_is_cut_when_every_part_can_be_and_stays_off_disk(tmp_path: Path) -> None:
    both = CacheList(fill(KVCache(), 4), fill(RotatingKVCache(max_size=8), 4, one_by_one=True))
    rules = fam.rules_of(both)
    assert rules.can_cut == "sometimes" and rules.trimmable(both) and fam.layer_offset(both) is None
    fam.cut_back([both], 1)
    assert [p.offset for p in both.caches] == [3, 3]
    wrapped = CacheList(fill(KVCache(), 9), fill(RotatingKVCache(max_size=8), 9, one_by_one=True))
    assert not rules.trimmable(wrapped)
    assert disk_roundtrip(tmp_path, [both], 3) is None and not fam.persisted("CacheList")


def test_a_class_not_in_the_table_gets_the_safe_rules(tmp_path: Path) -> None:
    class MyKV(KVCache):  # a model's own cache: it may cut back differently, so nothing is assumed
        pass

    c = fill(MyKV(), 4)
    rules = fam.rules_of(c)
    assert rules.name == "MyKV" and rules.can_cut == "sometimes" and not rules.persist
    assert rules.trimmable(c) and fam.layer_offset(c) == 4 and not fam.always_trimmable([c])
    assert fam.rules_named("MyKV") is None and not fam.persisted("MyKV")
    assert fam.cut_reason(["MyKV"], 4, 2) == "cache cannot be cut back: 4 -> 2"
    assert disk_roundtrip(tmp_path, [c], 4) is None


def test_every_tiny_family_builds_only_classes_in_the_table(tmp_path: Path) -> None:
    """The families the tests run on (tests/tiny_models.py) meet only rows of the table, all on disk."""
    from engine.engine import Engine

    seen = set()
    for family in FAMILIES:
        eng = Engine(use_disk=False, chunk=8)
        eng.load(str(build_model(tmp_path / family, family)))
        cache = eng.lm.new_cache()
        assert all(type(c) in fam.RULES for c in cache), family
        assert all(fam.persisted(name) for name in fam.class_names(cache))
        seen.update(fam.class_names(cache))
    assert seen == {"KVCache", "QuantizedKVCache", "RotatingKVCache", "ArraysCache"}
