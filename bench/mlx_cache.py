"""MLX's buffer cache limit (`mx.set_cache_limit`): what each limit costs in speed, side by side.

MLX keeps freed buffers for reuse up to its cache limit (on Metal its default is the memory limit,
most of the machine; on the CPU backend 32 MiB). A chat asks for buffers of a new size every turn
(the KV cache and the prefill's activations grow with the conversation), so a large cache keeps
growing with a long session and is never given back. What a smaller limit costs: MLX allocates
(and the OS faults in) new memory where it would have reused a cached buffer.

One process, one loaded engine (demo model, exact mode, disk tier off). Per limit: the prompt
cache and MLX's cache cleared, then a chat of --turns turns (each user message ~--new tokens,
each reply --reply tokens, end tokens ignored so every run does the same work) and a regenerate of
its last reply. Limits are interleaved, their order rotated between repetitions; medians over
turns 2.. and repetitions; ratios against 32 MiB (the CPU backend's default) per repetition.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 PYTHONPATH=. \\
        .venv/bin/python bench/mlx_cache.py [--reps 3] [--turns 5]
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common as C  # noqa: E402

MIB = 1 << 20
LIMITS = {"0": 0, "32MiB": 32 * MIB, "128MiB": 128 * MIB, "512MiB": 512 * MIB, "unbounded": 1 << 40}
BASE = "32MiB"


def session(engine, limit: int, salt: int, turns: int, new: int, reply: int, first: int) -> dict:
    """One chat under `limit`: per turn (ttft, prefill tok/s, decode tok/s), the regenerate's ttft,
    the most MLX cached and the RSS at the end."""
    import mlx.core as mx

    from engine.memory import limit_mlx_cache, process_rss
    from engine.types import GenerationRequest, SamplerSettings

    engine.clear_cache()
    limit_mlx_cache(limit)
    mx.clear_cache()
    settings = SamplerSettings(max_tokens=reply, temperature=0.7, seed=salt)
    msgs: list[dict] = []
    out: dict = {"turns": [], "cache_max": 0}
    for t in range(turns):
        n = first if t == 0 and first else new
        msgs = msgs + [{"role": "user", "content": C.text_of_tokens(engine, n, salt * 100 + t)}]
        cpu, faults = time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        r = engine.generate(GenerationRequest(msgs, settings))
        cpu, faults = time.process_time() - cpu, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        out["turns"].append((r.report.ttft_s, r.report.prefill_tps, r.report.decode_tps, r.report.prompt_tokens, cpu,
                             faults))
        out["cache_max"] = max(out["cache_max"], mx.get_cache_memory())
        msgs = msgs + [{"role": "assistant", "content": r.text}]
    cpu = time.process_time()
    regen = engine.generate(GenerationRequest(msgs[:-1], settings))
    out["regen_ttft"], out["regen_cpu"] = regen.report.ttft_s, time.process_time() - cpu
    out["cache_max"] = max(out["cache_max"], mx.get_cache_memory())
    out["rss"] = process_rss()
    return out


def main() -> None:
    args = C.bench_args(__doc__.splitlines()[0], _extra)
    C.ensure_openblas()
    t0 = time.perf_counter()
    reps, turns = (1, 3) if args.quick else (args.reps, args.turns)
    engine, _ = C.load_engine("demo", use_disk=False)
    engine.lm.eos_ids = set()  # every reply exactly --reply tokens: the same work in every run
    C.warm_up(engine)
    names = list(dict.fromkeys([*args.limits, BASE]))  # the ratios need the base
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for rep in range(reps):
        order = names[rep % len(names):] + names[: rep % len(names)]
        for n in order:
            s = session(engine, LIMITS[n], 1000 + rep, turns, args.new, args.reply, args.first)
            runs[n].append(s)
            C.log(f"rep {rep} {n:>9}: ttft " + " ".join(f"{t[0] * 1000:.0f}" for t in s["turns"])
                  + " ms, CPU " + " ".join(f"{t[4]:.1f}" for t in s["turns"])
                  + " s, page faults " + " ".join(f"{t[5]}" for t in s["turns"])
                  + f" ms, regen {s['regen_ttft'] * 1000:.0f} ms, cache max {s['cache_max'] / MIB:.0f} MiB, "
                  f"RSS {s['rss'] / MIB:.0f} MiB")
    engine.close()

    def med(n: str, k: int) -> float:  # turns 2.. (the first is a cold prefill)
        return C.median([t[k] for s in runs[n] for t in s["turns"][1:]])

    def paired(n: str, k: int) -> float:
        return C.median([a["turns"][i][k] / b["turns"][i][k] for a, b in zip(runs[n], runs[BASE])
                         for i in range(1, turns) if b["turns"][i][k]])

    rows = []
    for n in names:
        regen = C.median([s["regen_ttft"] for s in runs[n]])
        regen_base = C.median([s["regen_ttft"] for s in runs[BASE]])
        rows.append([n, C.fmt_s(med(n, 0)), f"{med(n, 1):.0f}", f"{med(n, 2):.1f}", C.fmt_s(regen),
                     f"{med(n, 4):.2f}", f"{med(n, 5):,.0f}",
                     C.fmt_ratio(paired(n, 0)), C.fmt_ratio(paired(n, 1)), C.fmt_ratio(paired(n, 2)),
                     C.fmt_ratio(paired(n, 4)), C.fmt_ratio(regen / regen_base),
                     f"{max(s['cache_max'] for s in runs[n]) / MIB:.0f}", f"{max(s['rss'] for s in runs[n]) / MIB:.0f}"])
    res = C.Result(7, "mlx_cache", "MLX's buffer cache limit: speed per limit, side by side",
                   C.command_line("mlx_cache.py", args.quick, f"--reps {reps} --turns {turns}"
                       + (f" --first {args.first}" if args.first else "") + f" --limits {' '.join(names)}"))
    res.tables.append(C.md_table(
        ["cache limit", "follow-up TTFT", "prefill tok/s", "decode tok/s", "regenerate TTFT", "CPU s a turn",
         "page faults a turn", f"TTFT / {BASE}", f"prefill / {BASE}", f"decode / {BASE}", f"CPU s / {BASE}",
         f"regenerate / {BASE}",
         "MLX cache max (MiB)", "RSS after (MiB)"], rows))
    prompts = [t[3] for t in runs[BASE][0]["turns"]]
    res.notes.append(f"{C.DEMO_LABEL}, exact mode, disk tier off; {reps} repetitions x {turns} turns of ~{args.new} new "
                     f"tokens and {args.reply}-token replies (prompts {prompts[0]}..{prompts[-1]} tokens); TTFT and "
                     "rates from the engine's reports, medians over turns 2.. (the first is a cold prefill); ratios "
                     "are medians of per-turn ratios against the same turn of the same repetition at "
                     f"{BASE}. CPU s: the process's CPU time over the turn's whole generate call (all its "
                     "threads; what another process's load does not add), page faults: its minor faults (new "
                     "memory touched: what a buffer taken from MLX's cache saves).")
    res.data = {"runs": runs}
    C.finish(res, args, t0)


def _extra(p) -> None:
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--new", type=int, default=394, help="tokens of each user message")
    p.add_argument("--reply", type=int, default=32, help="tokens of each reply")
    p.add_argument("--first", type=int, default=0, help="tokens of the first message (0: --new): the later "
                   "turns then run at that long a context")
    p.add_argument("--limits", nargs="+", choices=list(LIMITS), default=list(LIMITS), help="which limits")


if __name__ == "__main__":
    main()
