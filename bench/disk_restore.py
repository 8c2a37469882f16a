"""A restore from the disk tier after a restart, old tree against new, side by side (issue 27).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 .venv/bin/python \\
        bench/disk_restore.py --tokens 4096 --trials 3 [--turns 16] --old <checkout of the tree before>

No model: a 24-layer KV state of `--tokens` positions (4 heads x 64, float32: the demo model's
shape, ~192 MiB at 4,096) is stored as a pre-last snapshot with the canonical history of a
`--tokens + 1`-token prompt (chunks of 256), through each tree's own `PromptCache` and disk
tier, in a fresh folder by one process (which flushes and exits; `--turns K`: as K saves of
growing prefixes, like a chat's turns, so the block store reads K packs); a second process (the
restart) opens the folder and times `PromptCache.fetch` of the prompt: read, check, rebuild,
promote to memory and hand out the private copy a generation continues from, then write one
position into every layer as the first forward does (a tree whose restore shares the stored
buffer, or has no room to grow, copies it there instead: counted). The arms
alternate, each trial in new processes and folders, and the restored bits are compared with
the state stored (equal, or the trial fails).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
CHUNK = 256


def _state(n: int):
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    mx.random.seed(n)
    cache = [KVCache() for _ in range(24)]
    for c in cache:
        c.update_and_fetch(mx.random.normal((1, 4, n, 64)), mx.random.normal((1, 4, n, 64)))
    mx.eval([a for c in cache for a in (c.keys, c.values)])
    return cache


def _prompt(n: int) -> list[int]:
    return [(7 * i) % 5000 + 1 for i in range(n + 1)]


def _digest(cache, n: int) -> str:
    import hashlib

    import numpy as np

    h = hashlib.sha256()
    for c in cache:
        for a in (c.keys, c.values):
            h.update(np.array(a[..., :n, :]).tobytes())
    return h.hexdigest()


def _prompt_cache(root: Path):
    from engine.cache.disk.tier import DiskCache

    try:
        from engine.cache.prompt_cache import PromptCache
    except ImportError:  # the tree before the block store
        from engine.cache.memory import PromptCache  # type: ignore[no-redef]
    return PromptCache(4 << 30, DiskCache(root, budget_bytes=8 << 30))


def child_write(root: Path, n: int, turns: int = 1) -> dict:
    """Store the state of the first n tokens; `turns` > 1: as a chat would, the prefixes ending
    at `turns` evenly spaced chunk cuts first, one save each (the block store then holds the
    state in `turns` packs, the tree before in `turns` files)."""
    import dataclasses

    from engine.cache.meta import SnapshotMeta
    from engine.cache.planner import chunks, schedule_cuts
    from engine.cache.snapshot import Snapshot, cache_nbytes, clone_cache, new_snapshot_id

    prompt = _prompt(n)
    cuts = schedule_cuts(len(prompt), CHUNK)
    live = _state(n)
    names = {f.name for f in dataclasses.fields(SnapshotMeta)}
    pc = _prompt_cache(root)
    ends = sorted({cuts[(len(cuts) - 1) * j // turns] for j in range(1, turns)} | {n})
    for end in ends:
        part = [copy_layer(c, end) for c in live]
        snap_cache = clone_cache(part)
        mine = tuple(c for c in cuts if c <= end)
        extra = {}
        if "forwards" in names:
            extra = {"forwards": tuple(chunks(0, mine)), "block_ends": tuple(c for c in mine if c < end)}
        meta = SnapshotMeta(new_snapshot_id(), "k" * 32, tuple(prompt[:end]), "pre-last", mine, ("KVCache",) * 24,
                            True, cache_nbytes(snap_cache), **extra)
        pc.put(Snapshot(meta, snap_cache))
        assert pc.disk.flush(600)
    files = len(list((root / "snapshots").glob("*.safetensors")))
    assert pc.disk.close()
    return {"digest": _digest(live, n), "files": files}


def copy_layer(c, end: int):
    """Layer `c` holding only its first `end` positions."""
    from mlx_lm.models.cache import KVCache

    d = KVCache()
    d.update_and_fetch(c.keys[..., :end, :], c.values[..., :end, :])
    return d


def child_read(root: Path, n: int) -> dict:
    from engine.cache.planner import schedule_cuts

    prompt = _prompt(n)
    pc = _prompt_cache(root)
    import mlx.core as mx

    t = time.perf_counter()
    plan, cache = pc.fetch("k" * 32, prompt, "exact", schedule_cuts(len(prompt), CHUNK))
    # what the first forward writes (one position per layer): a tree that hands out a restore
    # sharing the stored buffer (or without room) copies it here instead
    one = mx.ones((1, 4, 1, 64))
    for c in cache:
        c.update_and_fetch(one, one)
    mx.eval([a for c in cache for a in (c.keys, c.values)])
    dt = time.perf_counter() - t
    assert cache is not None and plan.reuse == n and plan.source == "disk", (plan, pc.disk.stats())
    out = {"seconds": dt, "digest": _digest(cache, n)}  # the first n positions: the restored state
    pc.disk.close()
    return out


def run_child(checkout: Path, mode: str, root: Path, n: int, turns: int = 1) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    p = subprocess.run([sys.executable, str(HERE), "--child", mode, "--root", str(root), "--tokens", str(n),
                        "--turns", str(turns)],
                       cwd=checkout, env=env, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise SystemExit(f"{mode} in {checkout} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--old", type=Path, help="a checkout of the tree to compare with (before the block store)")
    p.add_argument("--turns", type=int, default=1, help="store the state in this many saves (a chat's turns)")
    p.add_argument("--child", choices=("write", "read"))
    p.add_argument("--root", type=Path)
    args = p.parse_args()
    if args.child:
        out = child_write(args.root, args.tokens, args.turns) if args.child == "write" else child_read(args.root, args.tokens)
        print(json.dumps(out))
        return
    arms = {"new": HERE.parent.parent}
    if args.old is not None:
        arms = {"old": args.old.resolve(), **arms}
    times: dict[str, list[float]] = {a: [] for a in arms}
    for trial in range(args.trials):
        for arm, checkout in arms.items():
            root = Path(tempfile.mkdtemp(prefix=f"verbatim-disk-restore-{arm}-"))
            try:
                wrote = run_child(checkout, "write", root, args.tokens, args.turns)
                read = run_child(checkout, "read", root, args.tokens)
            finally:
                shutil.rmtree(root, ignore_errors=True)
            assert read["digest"] == wrote["digest"], f"{arm}: the restored state differs from the stored one"
            times[arm].append(read["seconds"])
            print(f"trial {trial + 1} {arm}: restore {read['seconds'] * 1000:.0f} ms ({wrote['files']} files)",
                  file=sys.stderr)
    summary = {a: sorted(t)[len(t) // 2] for a, t in times.items()}
    if "old" in summary:
        summary["new/old"] = summary["new"] / summary["old"]
    print(json.dumps({"tokens": args.tokens, "turns": args.turns, "times": times, "median": summary}))


if __name__ == "__main__":
    main()
