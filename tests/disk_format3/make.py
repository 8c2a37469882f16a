"""Writes the cache folder next to this file: index.json and snapshots/*.safetensors, one snapshot
of every kind, as the disk tier writes them (format 3). tests/cache/test_disk_ownership.py opens the
committed copy and checks that today's code reads it and writes its index back byte for byte.

The committed files were written by the code before the snapshot kinds and restore sources became
enums (the commit the folder was added in says which); rerun this only when the format changes:

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 PYTHONPATH=. \\
        .venv/bin/python tests/disk_format3/make.py [OUT]

The compute environment is pinned (`ENV`), so the folder reads the same on every machine; the
arrays come from `arrays()`, so a test can compare what it loads with what was saved.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache

HERE = Path(__file__).resolve().parent
ENV = "format-3 fixture env"
KEY = "f" * 32
DIGEST = "ab" * 32  # a document's SHA-256, as a "document" snapshot names it
# kind -> (first token, length, exact cuts, a whole-state layer besides the KV one)
SNAPSHOTS: dict[str, tuple[int, int, tuple[int, ...], bool]] = {
    "pre-last": (100, 23, (8, 16, 23), False),
    "end": (200, 30, (8, 16, 21), False),
    "boundary": (300, 16, (8, 16), True),
    "partial": (400, 8, (8,), False),
    "document": (500, 16, (8, 16), False),
}


def arrays(first: int, n: int) -> tuple[mx.array, mx.array]:
    """The KV layer's keys and values of the snapshot whose tokens start at `first` (exact in fp16)."""
    base = mx.arange(2 * n * 8, dtype=mx.float32).reshape(1, 2, n, 8) / 8
    return (base + first).astype(mx.float16), (base - first).astype(mx.float16)


def whole(first: int) -> list[mx.array]:
    """The whole-state layer's arrays (an SSM-like ArraysCache)."""
    return [mx.full((1, 3, 4), first / 4, dtype=mx.float32), mx.full((1, 2, 2), -first / 4, dtype=mx.float32)]


def forwards(n: int, cuts: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """Prefilled up to the last cut, decoded one token at a time after it."""
    out, pos = [], 0
    for c in cuts:
        out.append((pos, c))
        pos = c
    return (*out, *((p, p + 1) for p in range(pos, n)))


def snapshot(kind: str) -> Any:
    from engine.cache.meta import SnapshotMeta
    from engine.cache.snapshot import Snapshot, cache_nbytes, clone_cache, new_snapshot_id

    first, n, cuts, with_whole = SNAPSHOTS[kind]
    kv = KVCache()
    kv.update_and_fetch(*arrays(first, n))
    layers: list[Any] = [kv]
    if with_whole:
        ssm = ArraysCache(size=2)
        ssm[0], ssm[1] = whole(first)
        layers.append(ssm)
    cache = clone_cache(layers)
    classes = tuple(type(c).__name__ for c in layers)
    meta = SnapshotMeta(new_snapshot_id(), KEY, tuple(range(first, first + n)), kind, cuts, classes,
                        not with_whole, cache_nbytes(cache), forwards=forwards(n, cuts), block_ends=cuts,
                        documents=(DIGEST,) if kind == "document" else ())
    return Snapshot(meta, cache)


def main(out: Path) -> None:
    import engine.cache.disk.tier as tier

    tier.compute_env = lambda: ENV  # type: ignore[assignment]
    shutil.rmtree(out / "snapshots", ignore_errors=True)
    (out / "index.json").unlink(missing_ok=True)
    disk = tier.DiskCache(out, budget_bytes=1 << 30)
    for kind in SNAPSHOTS:
        disk.save_async(snapshot(kind))
        assert disk.flush(60)
    assert disk.stats()["entries"] == len(SNAPSHOTS) and not disk.warnings, disk.stats()
    assert disk.close(60)
    (out / ".lock").unlink(missing_ok=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
