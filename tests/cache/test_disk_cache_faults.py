"""The four small faults of issue 37, each pinned: a failure on the memory side of a restore,
eviction's reservation of whole layers, a KV layer without keys, the skip counter."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache

from engine.cache.disk.hooks import WriterHooks
from engine.cache.disk.plan import plan_packs
from engine.cache.disk.tier import DiskCache
from engine.cache.memory_tier import MemoryTier
from engine.cache.meta import SnapshotMeta
from engine.cache.snapshot import Snapshot, cache_nbytes, clone_cache, new_snapshot_id
from engine.errors import SnapshotError
from tests.engine_helpers import QUESTIONS, make_engine, request


def test_a_memory_side_failure_forgets_the_memory_copy_and_keeps_the_disk_entry(llama: Path, tmp_path: Path,
                                                                                monkeypatch) -> None:
    eng = make_engine(llama, use_disk=True, cache_dir=tmp_path / "cache")
    try:
        msgs = [{"role": "user", "content": QUESTIONS[0]}]
        first = eng.generate(request(msgs))
        disk = eng.cache.disk
        assert disk is not None and disk.flush(60)
        key = first.report.model_key
        on_disk = {m.id for m in disk.entries(key)}
        assert on_disk

        def broken(*args, **kw):  # the fault injected: the memory copy cannot be restored
            raise SnapshotError("damaged in memory")

        with monkeypatch.context() as m:
            m.setattr(eng.cache.memory, "restore", broken)
            second = eng.generate(request(msgs))
        assert second.tokens == first.tokens and second.logprobs == first.logprobs
        failed = [d for d in second.report.declines if "damaged in memory" in d]
        assert failed and failed[0].startswith("memory snapshot")
        sid = failed[0].split()[2]
        assert sid in on_disk and sid in {m.id for m in disk.entries(key)}  # the disk entry is kept
        assert not eng.cache.memory.touch(sid) or second.report.source == "disk"  # the memory copy went
        third = eng.generate(request(msgs))
        assert third.tokens == first.tokens and third.logprobs == first.logprobs
        assert third.report.restored == third.report.prompt_tokens - 1
    finally:
        eng.close()


def _mixed_snapshot(n: int, seed: int) -> Snapshot:
    """A KV layer (in blocks) and an ArraysCache layer (whole) over `n` tokens."""
    mx.random.seed(seed)
    kv = KVCache()
    kv.update_and_fetch(mx.random.normal((1, 2, n, 64)), mx.random.normal((1, 2, n, 64)))
    arr = ArraysCache(2)
    arr[0] = mx.random.normal((1, 256, 64))
    arr[1] = mx.random.normal((1, 256, 64))
    cache = clone_cache([kv, arr])
    tokens = tuple(range(seed * 1000, seed * 1000 + n))
    meta = SnapshotMeta(new_snapshot_id(), "k" * 32, tokens, "end", (), ("KVCache", "ArraysCache"), False,
                        cache_nbytes(cache))
    return Snapshot(meta, cache)


class _Budget(WriterHooks):
    def __init__(self) -> None:
        self.cache: DiskCache | None = None
        self.over: list[int] = []

    def point(self, name: str) -> None:
        if name == "index_written" and self.cache is not None:
            used = self.cache.store.index.used_bytes()
            if used > self.cache.budget_bytes:
                self.over.append(used)


def test_eviction_before_a_save_makes_room_for_its_whole_layers_too(tmp_path: Path) -> None:
    """The folder never holds more than its budget once a save's manifest is committed: the
    eviction before the write reserves the whole layers' bytes as well as the blocks'."""
    hooks = _Budget()
    first = _mixed_snapshot(64, 1)
    probe = DiskCache(tmp_path / "probe")
    probe.save_async(first)
    assert probe.flush(60)
    one = probe.stats()["bytes"]
    probe.close()
    whole = cache_nbytes([first.cache[1]])
    blocks = cache_nbytes([first.cache[0]])
    # Room for a second snapshot's blocks but not for its whole layer as well: only a reservation
    # of both evicts the first snapshot before the second is committed.
    disk = DiskCache(tmp_path / "cache", budget_bytes=one + blocks + whole // 2, hooks=hooks)
    hooks.cache = disk
    try:
        for seed in (1, 2, 3):
            disk.save_async(_mixed_snapshot(64, seed))
            assert disk.flush(60)
        assert disk.stats()["writes"] == 3 and disk.stats()["evictions"] == 2
        assert hooks.over == []
    finally:
        disk.close()


def test_a_kv_layer_without_keys_is_whole_in_both_tiers(tmp_path: Path) -> None:
    mx.random.seed(0)
    full = KVCache()
    full.update_and_fetch(mx.random.normal((1, 2, 40, 64)), mx.random.normal((1, 2, 40, 64)))
    empty = KVCache()  # keys=None: nothing was forwarded into it
    meta = SnapshotMeta(new_snapshot_id(), "k" * 32, tuple(range(40)), "end", (), ("KVCache", "KVCache"), True,
                        cache_nbytes([full]))
    shared = MemoryTier(1 << 30).add(meta, [full, empty])
    assert shared.layers_in_blocks() == [True, False]
    disk = DiskCache(tmp_path / "cache")
    try:
        names, rows = plan_packs(shared, disk.env, set())
        assert names and rows and rows[-1].whole == meta.id  # the writer keeps it whole too
    finally:
        disk.close()


def test_skips_are_counted_on_both_threads(tmp_path: Path) -> None:
    from engine.cache.snapshot import Snapshot as S

    disk = DiskCache(tmp_path / "cache")
    try:
        snap = _mixed_snapshot(32, 1)
        disk.save_async(snap)
        assert disk.flush(60)
        disk.save_async(snap)  # the writer skips it: the disk holds it already
        unpersisted = S(SnapshotMeta(new_snapshot_id(), "k" * 32, (1, 2), "end", (), ("NoSuchCache",), False, 0), [])
        for _ in range(3):
            disk.save_async(unpersisted)  # the engine thread skips these
        assert disk.flush(60)
        assert disk.stats()["skipped"] == 4
    finally:
        disk.close()
