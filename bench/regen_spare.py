"""Regenerate time to first token right after a cold run, with and without the spare (issue 27).

One process, the demo model by default, memory tier only (`--disk`: with the default disk tier
in a fresh folder, whose writer then runs beside the regenerates): for each round and each arm
("before": `PromptCache.spares = False`, every restore copies the state from the memory tier's
blocks before its first forward; "after": the reply's live cache is handed over to the next
restore of its snapshot), a cold run of a new `--tokens`-token chat (greedy, 16 new tokens), then
`--repeat` regenerates, the first right after the cold run (`--pause` seconds after each reply:
a user's click; 0: back to back). Times in decode steps of that cold run. `--restore-only`: the
restore alone, no model.

  LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 PYTHONPATH=. \\
      .venv/bin/python bench/regen_spare.py --tokens 4349 --repeat 3 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common as C  # noqa: E402


def restore_only(n: int, trials: int = 3) -> None:
    """The restore alone, no model: a 24-layer KV state of `n` tokens (~204 MB at 4,349, like the
    demo model's) in the memory tier, restored to n - 1 by copying its blocks (before) and by
    handing the live cache that stored it over (after)."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    from engine.cache.memory_tier import MemoryTier
    from engine.cache.meta import SnapshotMeta
    from engine.cache.snapshot import cache_arrays, cache_nbytes, new_snapshot_id

    live = [KVCache() for _ in range(24)]
    for c in live:
        c.update_and_fetch(mx.random.normal((1, 4, n, 64)), mx.random.normal((1, 4, n, 64)))
    mx.eval(cache_arrays(live))
    tier = MemoryTier(8 << 30)
    meta = SnapshotMeta(new_snapshot_id(), "k" * 32, tuple(range(n)), "end", (n - 1,), ("KVCache",) * 24, True,
                        cache_nbytes(live), forwards=((0, n),))
    tier.add(meta, live)
    C.log(f"  state {C.fmt_bytes(meta.nbytes)}")
    for _ in range(trials):
        t = time.perf_counter()
        tier.restore(meta.id, n - 1)
        copied = time.perf_counter() - t
        t = time.perf_counter()
        tier.restore(meta.id, n - 1, live)
        C.log(f"  restore by copying {C.fmt_s(copied)}, by handing the live cache over {C.fmt_s(time.perf_counter() - t)}")
        for c in live:
            c.offset = n


def main() -> None:
    from engine.types import GenerationRequest, SamplerSettings

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="demo")
    p.add_argument("--tokens", type=int, default=4349)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--pause", type=float, default=0.0,
                   help="seconds between a reply and the next regenerate (a click; 0: back to back)")
    p.add_argument("--restore-only", action="store_true", help="time the restore alone (no model)")
    p.add_argument("--disk", action="store_true", help="with the default disk tier (a fresh folder)")
    args = p.parse_args()
    if args.restore_only:
        restore_only(args.tokens)
        return
    if args.disk:
        work = Path(tempfile.mkdtemp(prefix="verbatim-regen-"))
        engine, _ = C.load_engine(args.model, cache_dir=work)
    else:
        engine, _ = C.load_engine(args.model, use_disk=False)
    C.warm_up(engine)
    rows = []
    for rnd in range(args.rounds):
        for arm in ("before", "after"):
            engine.cache.clear()
            engine.cache.spares = arm == "after"
            msgs = C.messages_for_length(engine, args.tokens, salt=4349 + 10 * rnd + (arm == "after"))
            req = GenerationRequest(msgs, SamplerSettings(max_tokens=16))
            cold = engine.generate(req)
            step = 1 / cold.report.decode_tps
            regen = []
            for _ in range(args.repeat):
                time.sleep(args.pause)
                r = engine.generate(req)
                assert r.report.source == "memory" and r.tokens == cold.tokens, r.report.source
                assert r.logprobs == cold.logprobs
                regen.append(r.report.ttft_s)
            row = {"round": rnd, "arm": arm, "prompt": cold.report.prompt_tokens, "cold": cold.report.ttft_s,
                   "step": step, "regen": regen, "steps": [t / step for t in regen],
                   "spare_hits": engine.cache.stats()["spare_hits"]}
            rows.append(row)
            C.log(f"  {arm:6s} n={row['prompt']} step {C.fmt_s(step)}: regenerates "
                  + ", ".join(f"{C.fmt_s(t)} ({t / step:.2f} steps)" for t in regen))
    engine.close()
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
