"""Tokens/s on 1, 2 and 3 ranks (ring backend, ranks on this machine), and the all-reduce cost
per decode step.

    .venv/bin/python bench/distributed.py            # scripts/run.sh preloads OpenBLAS

Model: a random-weight f32 llama whose heads and MLP divide by 2 and by 3 (hidden 768, 8
layers, 12 heads / 6 KV heads, intermediate 2304, ~60M parameters; tests/tiny_models.py).
For each world size: one server (`python -m engine serve`, under the rank environment
mlx.launch gives, tests/cluster.py), REPS cold requests of a 130-token prompt and 32 decoded
tokens; the medians of the reports' prefill and decode tokens/s. Then, per world size, the time
of one all-reduce of a hidden-size f32 vector (what tensor parallelism sums twice per layer and
per token) and of the engine's one-int cancel flag, timed inside the ranks.

On one CPU machine more ranks are slower: the ranks share the same cores and memory bandwidth
and add all-reduces; the point of sharding is memory (each rank holds 1/N of the weights and of
the KV cache), and speed across machines depends on the link (Thunderbolt, RDMA).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPE = dict(hidden_size=768, intermediate_size=2304, num_hidden_layers=8, num_attention_heads=12,
             num_key_value_heads=6, head_dim=64)
REPS = int(os.environ.get("REPS", "3"))
STEPS = 200  # all-reduces timed per world size


def allreduce_child() -> None:
    """Run inside each rank: time all_sum of a hidden-size vector and of one int32."""
    import mlx.core as mx

    g = mx.distributed.init()
    hidden = mx.ones((1, 1, SHAPE["hidden_size"]), dtype=mx.float32)
    flag = mx.zeros((1,), dtype=mx.int32)
    out = {}
    for name, x in (("hidden", hidden), ("flag", flag)):
        for _ in range(20):
            mx.eval(mx.distributed.all_sum(x, stream=mx.cpu))
        t0 = time.perf_counter()
        for _ in range(STEPS):
            mx.eval(mx.distributed.all_sum(x, stream=mx.cpu))
        out[name] = (time.perf_counter() - t0) / STEPS
    if g.rank() == 0:
        print(json.dumps(out), flush=True)


def allreduce_cost(n: int) -> dict[str, float]:
    from tests.cluster import free_ports

    with tempfile.TemporaryDirectory() as d:
        hostfile = Path(d) / "hosts.json"
        hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in free_ports(n)]))
        procs = [subprocess.Popen([sys.executable, __file__, "--allreduce-child"], stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "MLX_RANK": str(r), "MLX_HOSTFILE": str(hostfile)})
                 for r in range(n)]
        outs = [p.communicate(timeout=300)[0] for p in procs]
    return json.loads(outs[0].strip().splitlines()[-1])


def serve_rate(model: Path, n: int) -> dict[str, float]:
    from tests.cluster import Cluster

    words = "The prompt cache keeps every layer's keys and values for the next turn. "
    msgs = [{"role": "user", "content": words * 8}]
    with tempfile.TemporaryDirectory() as d:
        # One rank too goes through the rank environment: a group of one serves as a plain server.
        c = Cluster(str(model), n, Path(d) / "cache", Path(d) / "logs", threads=max(1, (os.cpu_count() or 1) // n))
        try:
            c.start()
            reports = [c.chat(msgs, max_tokens=32, temperature=0.7, seed=i, verbatim={"cache": False})["verbatim"]
                       for i in range(REPS + 1)][1:]  # the first is a warm-up
        finally:
            c.close()
    return {"prompt": reports[0]["prompt_tokens"],
            "prefill_tps": statistics.median(r["prefill_tps"] for r in reports),
            "decode_tps": statistics.median(r["decode_tps"] for r in reports)}


def main() -> None:
    from tests.tiny_models import build_model

    model = build_model(ROOT / "build" / "bench-models" / "dist-llama-h768-l8", "llama", **SHAPE)
    rows = []
    for n in (1, 2, 3):
        rate = serve_rate(model, n)
        cost = allreduce_cost(n) if n > 1 else {"hidden": 0.0, "flag": 0.0}
        per_step = 2 * SHAPE["num_hidden_layers"] * cost["hidden"] + cost["flag"]
        rows.append((n, rate, cost, per_step))
        print(f"{n} rank(s): prefill {rate['prefill_tps']:.0f} tok/s, decode {rate['decode_tps']:.1f} tok/s; "
              f"all-reduce hidden {cost['hidden'] * 1e6:.0f} us, flag {cost['flag'] * 1e6:.0f} us, "
              f"per decode step {per_step * 1e3:.2f} ms", flush=True)
    print("\n| ranks | prefill tok/s | decode tok/s | decode step | all-reduce (768 f32) | cancel flag | "
          "all-reduces per step |")
    print("|---|---|---|---|---|---|---|")
    for n, rate, cost, per_step in rows:
        step = 1e3 / rate["decode_tps"] if rate["decode_tps"] else float("nan")
        print(f"| {n} | {rate['prefill_tps']:.0f} | {rate['decode_tps']:.1f} | {step:.1f} ms | "
              f"{cost['hidden'] * 1e6:.0f} us | {cost['flag'] * 1e6:.0f} us | "
              f"{per_step * 1e3:.2f} ms ({0 if n == 1 else 2 * SHAPE['num_hidden_layers'] + 1}) |")


if __name__ == "__main__":
    if "--allreduce-child" in sys.argv:
        allreduce_child()
    else:
        main()
