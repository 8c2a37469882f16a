"""Item 6: Linux CPU backend: prefill and decode with and without OpenBLAS preloaded, 4-bit weights
kept vs expanded to f32 at load, on the demo model; and whether the engine's automatic choice
(`Engine(dequantize=None)`) picks the faster one.

MLX's Linux CPU wheel links a reference BLAS, and its quantized matmul does not use BLAS at all.
The BLAS is chosen when the process starts (LD_PRELOAD), so each BLAS gets its own child process;
inside a child the two weight formats are loaded side by side (`Engine(dequantize=False)` and
`Engine(dequantize=True)`) and their runs interleaved (order alternating), so the f32 / 4-bit
ratio is measured side by side; the OpenBLAS / reference ratio compares two back-to-back
processes. Each run: a fresh prompt, no prompt cache, EOS ignored, greedy.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common as C  # noqa: E402

PROMPT = 128
DECODE = 12


def child(prompt_len: int, decode: int, reps: int) -> dict:
    from engine.types import GenerationRequest, SamplerSettings

    auto = C.load_engine("demo", use_disk=False)[0].info.dequantized  # what the engine picks by itself
    engines = {}
    for name, deq in (("q4", False), ("f32", True)):
        e, load_s = C.load_engine("demo", use_disk=False, dequantize=deq)
        e.lm.eos_ids = set()
        C.warm_up(e, 24)
        engines[name] = (e, load_s)
    runs: dict[str, list] = {"q4": [], "f32": []}
    for rep in range(reps):
        for name in (("q4", "f32") if rep % 2 == 0 else ("f32", "q4")):
            e = engines[name][0]
            msgs = C.messages_for_length(e, prompt_len, salt=600 + rep)
            r = e.generate(GenerationRequest(msgs, SamplerSettings(max_tokens=decode), use_cache=False))
            runs[name].append({"prefill_tps": r.report.prefill_tps, "decode_tps": r.report.decode_tps,
                               "prompt": r.report.prompt_tokens})
            C.log(f"  {C.blas_name()} {name}: prefill {r.report.prefill_tps:.1f} tok/s, decode "
                  f"{r.report.decode_tps:.2f} tok/s")
    return {"blas": C.blas_name(), "auto_dequantize": auto, "runs": runs,
            "load_s": {k: v[1] for k, v in engines.items()}}


def main() -> None:
    args = C.bench_args(__doc__.splitlines()[0], _extra)
    if args.child:
        print(json.dumps(child(args.prompt, args.decode, args.reps)))
        return
    t0 = time.perf_counter()
    res = C.Result(6, "cpu_backend", "Linux CPU backend: OpenBLAS and 4-bit vs f32 weights (demo model)",
                   C.command_line("cpu_backend.py", args.quick))
    if not sys.platform.startswith("linux") or C.find_openblas() is None:
        res.status = "pending"
        res.notes.append("Not measured: needs Linux with OpenBLAS installed (apt-get install libopenblas0-pthread).")
        C.finish(res, args, t0)
        return
    reps = 1 if args.quick else args.reps
    prompt = 48 if args.quick else args.prompt
    base = [__file__, "--child", "--prompt", str(prompt), "--decode", str(args.decode), "--reps", str(reps)]
    out = {}
    for preload in (True, False):
        C.log(f"child: {'OpenBLAS preloaded' if preload else 'reference BLAS'}")
        env = C.env_with_blas(preload, {"VERBATIM_BENCH_NO_REEXEC": "1"})
        out["openblas" if preload else "reference"] = C.run_json_child(base, env)
    res.data = out
    med = {(b, w): (C.median([r["prefill_tps"] for r in out[b]["runs"][w]]),
                    C.median([r["decode_tps"] for r in out[b]["runs"][w]]))
           for b in out for w in ("q4", "f32")}
    rows = []
    for b, blabel in (("reference", "MLX reference BLAS"), ("openblas", "OpenBLAS preloaded")):
        q, f = med[(b, "q4")], med[(b, "f32")]
        pre_r = C.median([a["prefill_tps"] / c["prefill_tps"] for a, c in zip(out[b]["runs"]["f32"], out[b]["runs"]["q4"])])
        dec_r = C.median([a["decode_tps"] / c["decode_tps"] for a, c in zip(out[b]["runs"]["f32"], out[b]["runs"]["q4"])])
        auto = "f32 (dequantized)" if out[b]["auto_dequantize"] else "4-bit kept"
        faster_pre = "f32" if pre_r > 1 else "4-bit"
        faster_dec = "f32" if dec_r > 1 else "4-bit"
        ok = (out[b]["auto_dequantize"] == (pre_r > 1)) and (out[b]["auto_dequantize"] == (dec_r > 1))
        rows.append([blabel, f"{q[0]:.1f}", f"{f[0]:.1f}", f"**{pre_r:.2f}**", f"{q[1]:.2f}", f"{f[1]:.2f}",
                     f"**{dec_r:.2f}**", auto, f"prefill: {faster_pre}, decode: {faster_dec}",
                     "yes" if ok else "**no**"])
    res.tables.append(C.md_table(
        ["BLAS", "4-bit prefill tok/s", "f32 prefill tok/s", "f32 / 4-bit prefill", "4-bit decode tok/s",
         "f32 decode tok/s", "f32 / 4-bit decode", "engine's auto choice", "faster", "auto picks the faster"], rows))
    ob = {w: (med[("openblas", w)][0] / med[("reference", w)][0], med[("openblas", w)][1] / med[("reference", w)][1])
          for w in ("q4", "f32")}
    best_auto_ob = med[("openblas", "f32" if out["openblas"]["auto_dequantize"] else "q4")]
    best_auto_ref = med[("reference", "f32" if out["reference"]["auto_dequantize"] else "q4")]
    res.tables.append(C.md_table(
        ["weights", "prefill OpenBLAS / reference", "decode OpenBLAS / reference"],
        [["4-bit (quantized matmul, no BLAS)", f"{ob['q4'][0]:.2f}", f"{ob['q4'][1]:.2f}"],
         ["f32 (dequantized at load)", f"{ob['f32'][0]:.2f}", f"{ob['f32'][1]:.2f}"],
         ["engine default (auto) vs 4-bit with reference BLAS",
          f"{best_auto_ob[0] / med[('reference', 'q4')][0]:.1f}x", f"{best_auto_ob[1] / med[('reference', 'q4')][1]:.1f}x"]]))
    res.notes.append(
        f"Demo model, {prompt}-token prompts, {args.decode} decode tokens, {reps} repetition(s) per cell; the f32 / "
        "4-bit ratios are medians of per-repetition ratios within one process, the OpenBLAS / reference ratios "
        "compare medians of two back-to-back processes. The auto rule (engine/engine.py `_should_dequantize`): "
        "expand to f32 on the CPU backend while the f32 weights take at most a quarter of the RAM.")
    res.data["auto_reference_best"] = best_auto_ref
    C.finish(res, args, t0)


def _extra(p) -> None:
    p.add_argument("--child", action="store_true", help=__import__("argparse").SUPPRESS)
    p.add_argument("--prompt", type=int, default=PROMPT)
    p.add_argument("--decode", type=int, default=DECODE)
    p.add_argument("--reps", type=int, default=2)


if __name__ == "__main__":
    main()
