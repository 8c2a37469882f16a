"""Disk tier: does the engine thread wait on the background writer? (issue 37)

Fills a cache folder with many small snapshots (one pack each), reopens it with a budget that
holds only a fraction of them, so that the writer's first task evicts most of the folder (each
victim: the policy's order, the bytes each frees, a new index JSON of every entry left), and then
saves more snapshots into the full folder (each save evicts again). Meanwhile this thread (the
engine's, in the app) calls what a generation calls on the tier: `hold_writes` +
`release_writes` (every generation) and `entries()` (every lookup), and records how long each
call took. Printed: the calls made while the writer worked, and the median and max wait.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 PYTHONPATH=. \\
        .venv/bin/python bench/disk_writer_lock.py [--snapshots 1500] [--keep 0.3]

Run it against an older tree (`PYTHONPATH=/path/to/old/checkout`) to compare.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path


def _snapshot(i: int, n_tokens: int):  # type: ignore[no-untyped-def]
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    try:
        from engine.cache.meta import SnapshotMeta
    except ImportError:  # a tree from before the disk tier split
        from engine.cache.planner import SnapshotMeta  # type: ignore[no-redef]
    from engine.cache.snapshot import Snapshot, cache_nbytes, clone_cache, new_snapshot_id

    kv = KVCache()
    kv.update_and_fetch(mx.random.normal((1, 2, n_tokens, 16)), mx.random.normal((1, 2, n_tokens, 16)))
    cache = clone_cache([kv])
    tokens = tuple(range(i * n_tokens, (i + 1) * n_tokens))
    meta = SnapshotMeta(new_snapshot_id(), "k" * 32, tokens, "end", (), ("KVCache",), True, cache_nbytes(cache))
    return Snapshot(meta, cache)


def _probe(disk, busy: threading.Event, out: dict[str, list[float]]) -> None:  # type: ignore[no-untyped-def]
    """The engine thread's calls while `busy` is set."""
    while busy.is_set():
        t0 = time.perf_counter()
        disk.hold_writes()
        disk.release_writes()
        t1 = time.perf_counter()
        disk.entries("k" * 32)
        t2 = time.perf_counter()
        out["hold_writes"].append(t1 - t0)
        out["entries"].append(t2 - t1)
        time.sleep(0.0005)  # a lookup is not all the engine does


def _summary(xs: list[float]) -> dict[str, float]:
    return {"calls": len(xs), "median_ms": round(statistics.median(xs) * 1e3, 3) if xs else 0.0,
            "max_ms": round(max(xs) * 1e3, 3) if xs else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--snapshots", type=int, default=1500, help="snapshots in the folder before the shrink")
    ap.add_argument("--tokens", type=int, default=16, help="tokens per snapshot")
    ap.add_argument("--keep", type=float, default=0.3, help="the new budget, as a fraction of the folder")
    ap.add_argument("--more", type=int, default=100, help="saves into the full folder afterwards")
    args = ap.parse_args()

    from engine.cache.disk.tier import DiskCache

    root = Path(tempfile.mkdtemp(prefix="verbatim-lockbench-")) / "cache"
    t0 = time.perf_counter()
    disk = DiskCache(root, budget_bytes=1 << 40)
    for i in range(args.snapshots):
        disk.save_async(_snapshot(i, args.tokens))
    assert disk.flush(600)
    folder_bytes = disk.stats()["bytes"]
    disk.close()
    fill_s = time.perf_counter() - t0

    results: dict[str, dict[str, list[float]]] = {}
    saves = [_snapshot(args.snapshots + i, args.tokens) for i in range(args.more)]
    disk = DiskCache(root, budget_bytes=int(folder_bytes * args.keep))  # the first task evicts
    for phase in ("shrink", "saves"):
        out: dict[str, list[float]] = {"hold_writes": [], "entries": []}
        busy = threading.Event()
        busy.set()
        t = time.perf_counter()
        if phase == "saves":
            for s in saves:
                disk.save_async(s)
        probe = threading.Thread(target=_probe, args=(disk, busy, out))
        probe.start()  # stands for the engine thread (the writer is another thread, as in the app)
        assert disk.flush(600)
        busy.clear()
        probe.join()
        results[phase] = out
        print(f"{phase}: the writer worked {time.perf_counter() - t:.2f} s; "
              + "; ".join(f"{k} {_summary(v)}" for k, v in out.items()))
    stats = disk.stats()
    disk.close()
    doc = {"snapshots": args.snapshots, "folder_bytes": folder_bytes, "fill_s": round(fill_s, 1),
           "evictions": stats["evictions"], "entries_left": stats["entries"],
           **{f"{p}_{k}": _summary(v) for p, r in results.items() for k, v in r.items()}}
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
