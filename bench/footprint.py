"""Item 4: prompt cache footprint per family (memory and disk bytes per 1k tokens), and disk writes
kept off the critical path (time to first token of the next generation, disk tier on vs off).

Part A, per cache family (the test suite's tiny f32 models: llama, gemma3 sliding window,
lfm2 conv + attention, llama with 8-bit KV quantization), the demo model and the real Gemma 3
270M (`gemma3-270m`, when its packages are installed; `--models` picks some): one cold generation
of a ~1024-token prompt, then close() (flushes the disk tier). Memory bytes are the snapshots'
array bytes (used part of each buffer only); disk bytes are the safetensors files as written,
with the writer thread's time per file.

Part B, larger tiny model: two engines, disk tier on and off. Each repetition does, on each
engine in turn (order alternating): a cold generation of a fresh 1024-token prompt, then at once
a regenerate of it (a memory hit whose TTFT is one decode step, the most sensitive case) while
the disk tier is still writing that cold generation's snapshots. Ratio = median over
repetitions of TTFT(disk on) / TTFT(disk off) of the regenerate, and the same for the cold
generation's decode tokens/s (the pre-last snapshot is written during that decode).
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common as C  # noqa: E402

FAMILIES = ("llama", "gemma3", "lfm2", "kvquant")
PROMPT = 1024


def footprint(model: str, prompt_len: int) -> dict:
    from engine.types import GenerationRequest, SamplerSettings

    cache_dir = C.BUILD / "prompt-cache" / f"footprint-{model}"
    shutil.rmtree(cache_dir, ignore_errors=True)
    engine, _ = C.load_engine(model, cache_dir=cache_dir)
    msgs = C.messages_for_length(engine, prompt_len, salt=4)
    r = engine.generate(GenerationRequest(msgs, SamplerSettings(max_tokens=8)))
    metas = engine.cache.metas()
    disk = engine.cache.disk
    engine.close()  # flush the writer
    log = list(disk.write_log) if disk is not None else []
    snaps = []
    mem = {(m.kind, m.length): m.nbytes for m in metas}
    for kind, tokens, nbytes, secs in log:  # every file the writer wrote, in order
        snaps.append({"kind": kind, "tokens": tokens, "mem_bytes": mem.pop((kind, tokens), None),
                      "disk_bytes": nbytes, "write_s": secs})
    for (kind, tokens), nbytes in mem.items():  # in memory but not written
        snaps.append({"kind": kind, "tokens": tokens, "mem_bytes": nbytes, "disk_bytes": None, "write_s": None})
    info = engine.info
    shutil.rmtree(cache_dir, ignore_errors=True)
    return {"prompt": r.report.prompt_tokens, "classes": sorted(set(info.cache_classes)), "snaps": snaps,
            "layers": info.layers}


def critical_path(reps: int, prompt_len: int) -> dict:
    from engine.types import GenerationRequest, SamplerSettings

    on, _ = C.load_engine("tiny", cache_dir=C.BUILD / "prompt-cache" / f"critical-{time.time_ns()}")
    off, _ = C.load_engine("tiny", use_disk=False)
    for e in (on, off):
        C.warm_up(e)
    runs: dict[str, list] = {"on": [], "off": []}
    for rep in range(reps):
        order = (("on", on), ("off", off)) if rep % 2 == 0 else (("off", off), ("on", on))
        for name, e in order:
            msgs = C.messages_for_length(e, prompt_len, salt=7000 + rep)
            req = GenerationRequest(msgs, SamplerSettings(max_tokens=8))
            cold = e.generate(req)
            pending = e.cache.disk.stats()["pending"] if e.cache.disk is not None else 0
            regen = e.generate(req)
            assert regen.report.source == "memory", regen.report.source
            runs[name].append({"cold_ttft": cold.report.ttft_s, "cold_decode_tps": cold.report.decode_tps,
                               "regen_ttft": regen.report.ttft_s, "pending_at_regen": pending})
            C.log(f"  disk {name:3s} rep {rep}: cold ttft {C.fmt_s(cold.report.ttft_s)}, decode "
                  f"{cold.report.decode_tps:.1f} tok/s; regenerate ttft {C.fmt_s(regen.report.ttft_s)} "
                  f"(writes pending when it started: {pending})")
        if e.cache.disk is not None:
            e.cache.disk.flush()
    log = list(on.cache.disk.write_log)
    on.close()
    off.close()
    return {"runs": runs, "write_log": log, "prompt": prompt_len}


def _extra(p) -> None:
    p.add_argument("--models", nargs="+",
                   help=f"part A's models (default: the families, demo and {C.GEMMA} when installed)")
    p.add_argument("--skip-critical-path", action="store_true", help="part A only")


def main() -> None:
    args = C.bench_args(__doc__.splitlines()[0], _extra)
    C.ensure_openblas()
    t0 = time.perf_counter()
    res = C.Result(4, "footprint", "Prompt cache footprint per family; disk writes off the critical path",
                   C.command_line("footprint.py", args.quick))
    rows = []
    models = args.models or [f"family-{f}" for f in FAMILIES] + ["demo"] + ([C.GEMMA] if C.gemma_installed() else [])
    if args.models is None and C.GEMMA not in models:
        res.notes.append(f"{C.GEMMA} skipped: its packages are not installed (scripts/venv.sh installs them).")
    labels = {"demo": "demo (SmolLM2-135M, f32 KV)",
              C.GEMMA: "gemma3-270m (Gemma 3 270M, 15 sliding-window layers of 512 + 3 global)"}
    for model in models:
        C.log(f"{model}: footprint at {PROMPT} tokens")
        d = footprint(model, PROMPT)
        res.data[model] = d
        label = labels.get(model, model.removeprefix("family-"))
        for s in d["snaps"]:
            per_mem = s["mem_bytes"] / s["tokens"] * 1000 if s["mem_bytes"] else None
            per_disk = s["disk_bytes"] / s["tokens"] * 1000 if s["disk_bytes"] else None
            rows.append([label, ", ".join(d["classes"]), s["kind"], s["tokens"],
                         C.fmt_bytes(per_mem) if per_mem else "dropped (the end snapshot supersedes it)",
                         C.fmt_bytes(per_disk) if per_disk else "not written",
                         C.fmt_s(s["write_s"]) if s["write_s"] is not None else ""])
    res.tables.append(C.md_table(
        ["model / family", "cache classes", "snapshot", "tokens", "memory per 1k tokens", "disk per 1k tokens",
         "write time (writer thread)"], rows))
    res.notes.append(
        f"Tiny family models: hidden 256, 4 layers, f32 (tests/tiny_models.py); gemma3 has a 24-token sliding "
        f"window on every other layer (that ring does not grow, so its bytes per 1k tokens fall with length); "
        f"lfm2 has conv state on 2 of 4 layers. One cold generation of a ~{PROMPT}-token prompt stores a pre-last "
        f"snapshot (prompt - 1), an end snapshot (prompt + reply) and, for families that cannot trim, a "
        f"boundary checkpoint at the last multiple of C. A trimmable snapshot that another one extends is dropped "
        f"(memory) or deleted (disk) once the longer one is stored. Disk = the safetensors file (arrays + "
        f"a JSON header with the token ids).")

    if args.skip_critical_path:
        C.finish(res, args, t0)
        return
    reps = 2 if args.quick else 5
    C.log(f"tiny: disk tier on vs off, {reps} repetitions")
    d = critical_path(reps, 512 if args.quick else PROMPT)
    res.data["critical_path"] = d
    on, off = d["runs"]["on"], d["runs"]["off"]
    r_regen = C.median([a["regen_ttft"] / b["regen_ttft"] for a, b in zip(on, off)])
    r_dec = C.median([a["cold_decode_tps"] / b["cold_decode_tps"] for a, b in zip(on, off)])
    r_cold = C.median([a["cold_ttft"] / b["cold_ttft"] for a, b in zip(on, off)])
    overlapped = sum(1 for a in on if a["pending_at_regen"])
    writes = d["write_log"]
    res.tables.append(C.md_table(
        ["measure (larger tiny model, 1024-token prompt)", "disk tier off", "disk tier on", "on / off"],
        [["regenerate TTFT right after a cold generation", C.fmt_s(C.median([b["regen_ttft"] for b in off])),
          C.fmt_s(C.median([a["regen_ttft"] for a in on])), f"**{r_regen:.3f}**"],
         ["cold generation decode tok/s (pre-last snapshot being written)",
          f"{C.median([b['cold_decode_tps'] for b in off]):.2f}", f"{C.median([a['cold_decode_tps'] for a in on]):.2f}",
          f"{r_dec:.3f}"],
         ["cold generation TTFT", C.fmt_s(C.median([b["cold_ttft"] for b in off])),
          C.fmt_s(C.median([a["cold_ttft"] for a in on])), f"{r_cold:.3f}"]]))
    res.notes.append(
        f"Disk writes: {len(writes)} snapshot files, median {C.fmt_bytes(C.median([w[2] for w in writes]))} "
        f"written in {C.fmt_s(C.median([w[3] for w in writes]))} each on the writer thread "
        f"(serialise + SHA-256 + fsync + index); in {overlapped} of {len(on)} repetitions a write was still "
        f"pending when the regenerate started. Ratios are medians of per-repetition ratios.")
    res.target("regenerate TTFT, disk tier on / off (writes in flight)", r_regen, 1.10)
    C.finish(res, args, t0)


if __name__ == "__main__":
    main()
