"""Two instances on one prompt cache folder: the first writes (it holds the folder's flock), the
second reads. The reader sees what the writer adds (it re-reads index.json when the writer has
replaced it) and becomes the writer when the first instance exits (it takes the lock)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.cache.disk.tier import LOCKED, DiskCache
from tests.disk_helpers import KEY, assert_consistent
from tests.engine_helpers import kv_snapshot

pytest.importorskip("fcntl")


def test_a_reader_sees_the_writers_new_snapshots_and_takes_over_when_it_exits(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    writer = DiskCache(root, budget_bytes=1 << 30)
    reader = DiskCache(root, budget_bytes=1 << 30)
    assert writer.writable and not reader.writable and reader.read_only_reason == LOCKED
    assert reader.entries(KEY) == []

    first = kv_snapshot([1] * 40, seed=1)
    writer.save_async(first)
    assert writer.flush(10)
    reader.poll(force=True)  # (entries() polls at most every READER_POLL_S)
    assert [m.id for m in reader.entries(KEY)] == [first.meta.id] and reader.index_reloads == 1
    assert reader.load(reader.entries(KEY)[0]).meta.id == first.meta.id
    reader.poll(force=True)
    assert reader.index_reloads == 1  # unchanged index: not read again
    reader.save_async(kv_snapshot([3] * 40, seed=3))  # a reader never writes
    assert reader.flush(10) and len(list((root / "snapshots").iterdir())) == 1

    assert writer.close(10)  # the first instance exits
    reader.poll(force=True)
    assert reader.writable and reader.took_over and reader.read_only_reason is None
    second = kv_snapshot([2] * 40, seed=2)
    reader.save_async(second)
    assert reader.flush(10)
    assert {m.id for m in reader.entries(KEY)} == {first.meta.id, second.meta.id}
    third = DiskCache(root, budget_bytes=1 << 30)  # and now it holds the lock
    assert not third.writable and {m.id for m in third.entries(KEY)} == {first.meta.id, second.meta.id}
    third.close()
    assert reader.close(10)
    assert_consistent(root)
