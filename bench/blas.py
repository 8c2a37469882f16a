"""MLX CPU f32 prefill with MLX's bundled reference BLAS vs Debian's OpenBLAS preloaded.

    make bench-blas            (or: .venv/bin/python bench/blas.py [--tokens 512] [--repeats 2])

Builds a random-weight f32 llama (tests/tiny_models.py: hidden 1024, 8 layers, intermediate 2816), then
runs the same measurement in two fresh subprocesses, one without LD_PRELOAD and one with
OpenBLAS preloaded (the preload must be in place before the interpreter starts). Each child
prefills a fixed 512-token prompt in one forward (best of 2 by default, fresh cache each time) and decodes
32 tokens greedily. Prints a table and writes it to bench/results/blas.md. Linux only: on macOS
MLX runs on Metal and no BLAS is involved.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "blas.md"
sys.path.insert(0, str(ROOT))
from bench.common import LARGE_TINY_DIR as MODEL_DIR  # noqa: E402  (one model folder for all benches)
from bench.common import LARGE_TINY_SHAPE as SHAPE  # noqa: E402


def child(folder: Path, tokens: int, repeats: int, decode: int) -> dict:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model

    model, _ = load_model(folder)
    mx.eval(model.parameters())
    vocab = model.args.vocab_size
    prompt = mx.array([(i * 7919 + 13) % vocab for i in range(tokens)])[None]

    def prefill():
        cache = make_prompt_cache(model)
        start = time.perf_counter()
        logits = model(prompt, cache=cache)
        mx.eval(logits, [c.state for c in cache])
        return time.perf_counter() - start, cache, logits

    warm = make_prompt_cache(model)
    mx.eval(model(prompt[:, :16], cache=warm))  # warm-up (short: the reference BLAS is slow)
    times = []
    for _ in range(repeats):
        seconds, cache, logits = prefill()
        times.append(seconds)
    token = mx.argmax(logits[:, -1, :], axis=-1)
    start = time.perf_counter()
    for _ in range(decode):
        logits = model(token[:, None], cache=cache)
        token = mx.argmax(logits[:, -1, :], axis=-1)
        mx.eval(token)
    decode_s = time.perf_counter() - start
    # numpy maps its own OpenBLAS in both runs; what matters is whether the preload is mapped.
    maps = Path("/proc/self/maps").read_text() if Path("/proc/self/maps").exists() else ""
    preloaded = [p for p in os.environ.get("LD_PRELOAD", "").split(":") if p]
    mapped = any(os.path.realpath(p) in maps for p in preloaded)
    blas = "preloaded OpenBLAS" if mapped else "MLX bundled reference BLAS"
    return {
        "blas": blas,
        "prefill_s": min(times),
        "prefill_tps": tokens / min(times),
        "decode_tps": decode / decode_s,
        "ld_preload": os.environ.get("LD_PRELOAD", ""),
    }


def run_child(args: argparse.Namespace, preload: str | None) -> dict:
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if preload:
        env["LD_PRELOAD"] = preload
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(MODEL_DIR), "--tokens", str(args.tokens),
         "--repeats", str(args.repeats), "--decode", str(args.decode)],
        env=env, check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def find_openblas() -> str | None:
    found = subprocess.run(
        ["bash", "-c", f". {ROOT}/scripts/openblas.sh && verbatim_find_openblas"],
        capture_output=True, text=True,
    )
    return found.stdout.strip() or None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--decode", type=int, default=32)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.tokens, args.repeats, args.decode)))
        return 0

    if not sys.platform.startswith("linux"):
        print("bench/blas.py measures Linux's CPU BLAS; on macOS MLX uses Metal. Nothing to do.")
        return 0
    openblas = find_openblas()
    if not openblas:
        print("error: no OpenBLAS found (Debian/Ubuntu: apt-get install libopenblas0-pthread)", file=sys.stderr)
        return 1

    from tests.tiny_models import build_model

    build_model(MODEL_DIR, "llama", **SHAPE)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    reference = run_child(args, None)
    fast = run_child(args, openblas)
    prefill_ratio = fast["prefill_tps"] / reference["prefill_tps"]
    decode_ratio = fast["decode_tps"] / reference["decode_tps"]

    import mlx.core as mx

    cpu = platform.processor() or platform.machine()
    table = "\n".join([
        f"<!-- generated by bench/blas.py on {time.strftime('%Y-%m-%d')} -->",
        f"MLX {mx.__version__} CPU backend, {os.cpu_count()} cores ({cpu}), random f32 llama "
        f"(hidden {SHAPE['hidden_size']}, {SHAPE['num_hidden_layers']} layers, intermediate "
        f"{SHAPE['intermediate_size']}), {args.tokens}-token prefill in one forward (best of "
        f"{args.repeats}), {args.decode} greedy decode steps. Load average before the run: {load:.1f} "
        f"(other work on the machine makes the numbers noisy, decode especially).",
        "",
        "| BLAS | prefill s | prefill tok/s | decode tok/s |",
        "|---|---:|---:|---:|",
        f"| MLX bundled reference BLAS | {reference['prefill_s']:.2f} | {reference['prefill_tps']:.0f} | {reference['decode_tps']:.1f} |",
        f"| OpenBLAS (`LD_PRELOAD={openblas}`) | {fast['prefill_s']:.2f} | {fast['prefill_tps']:.0f} | {fast['decode_tps']:.1f} |",
        f"| **speed-up** | | **{prefill_ratio:.1f}x** | **{decode_ratio:.1f}x** |",
        "",
    ])
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(table)
    print(table)
    print(f"(written to {RESULTS.relative_to(ROOT)})")
    if fast["blas"] != "preloaded OpenBLAS" or reference["blas"] == fast["blas"]:
        print(f"warning: BLAS not as expected: {reference['blas']!r} vs {fast['blas']!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
