"""Item 2: engine decode and prefill tokens/s / mlx-lm's `stream_generate`, same model object.

One process per model. The engine is loaded as usual (on the CPU backend with OpenBLAS the demo
model's 4-bit weights are expanded to f32 at load); mlx-lm's `stream_generate` then runs on the
very same `model` and tokenizer objects, so both sides do identical arithmetic. Same prompt token
ids, greedy, the same number of tokens (EOS ignored on both sides so every run produces exactly
`--tokens`), and mlx-lm's `prefill_step_size` set to the engine's chunk (512; mlx-lm's own default
is 2048). mlx-lm prefills `prompt[:-1]` in steps from position 0 and forwards the last token with
the first decode step, which is exactly the engine's cold-run schedule, so the tokens must match.

Both sides are timed the same way from outside: t0 = call, t_k = token k handed to the caller,
t_end = generator/generate done. prefill tok/s = prompt tokens / (t_0 - t0) (what a user waits
for); decode tok/s = tokens from the third one on / (t_last - t_2): steady state on both sides,
whatever each does around its first token (mlx-lm queues the second forward before handing out
the first token, the engine after, so a first-to-last interval would charge one step to whichever
hands it out sooner); whole call = t_end - t0 (prefill, decode, and the engine's snapshots). The
engine runs with its prompt cache on (the default: it also takes the pre-last and end snapshots)
and, as a control, with `use_cache=False`. Each repetition uses a fresh prompt of the same length
(so the cache never hits); variants are interleaved and their order rotates between repetitions.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common as C  # noqa: E402

PROMPT = 600  # one full 512 chunk, a partial one, and the last token alone
QUICK_PROMPT = 200


def run_engine(engine, msgs, n_tokens: int, use_cache: bool) -> dict:
    from engine.types import GenerationRequest, SamplerSettings, TokenEvent

    stamps: dict[int, float] = {}

    def on_event(e) -> None:
        if isinstance(e, TokenEvent):
            stamps.setdefault(e.index, time.perf_counter())

    req = GenerationRequest(msgs, SamplerSettings(max_tokens=n_tokens), use_cache=use_cache)
    t0 = time.perf_counter()
    r = engine.generate(req, on_event=on_event)
    t_end = time.perf_counter()
    # ttft counts from after templating; t0 here is before it, as for mlx-lm (given ids, it has none)
    return _rates(len(r.prompt_ids), r.tokens, t0, stamps, t_end)


def run_mlx_lm(engine, ids, n_tokens: int, chunk: int) -> dict:
    from mlx_lm import stream_generate

    lm = engine.lm
    stamps: dict[int, float] = {}
    tokens = []
    t0 = time.perf_counter()
    for resp in stream_generate(lm.model, lm.tokenizer, prompt=ids, max_tokens=n_tokens, prefill_step_size=chunk):
        stamps[len(tokens)] = time.perf_counter()
        tokens.append(int(resp.token))
    t_end = time.perf_counter()
    return _rates(len(ids), tokens, t0, stamps, t_end)


def _rates(n_prompt: int, tokens: list, t0: float, stamps: dict[int, float], t_end: float) -> dict:
    first, last = min(stamps), max(stamps)
    steady = [i for i in stamps if i >= 2]
    k0 = min(steady) if steady else None
    return {
        "prompt": n_prompt,
        "n": len(tokens),
        "prefill_tps": n_prompt / (stamps[first] - t0),
        "decode_tps": (last - k0) / (stamps[last] - stamps[k0]) if k0 is not None and last > k0 else float("nan"),
        "ttft": stamps[first] - t0,
        "total_s": t_end - t0,
        "tokens": tokens,
    }


def measure(model: str, prompt_len: int, n_tokens: int, reps: int) -> dict:
    engine, _ = C.load_engine(model)  # disk tier on, as in the app (a bench-only cache dir)
    lm = engine.lm
    # Ignore EOS on both sides so every run produces exactly n_tokens (same work per run).
    lm.eos_ids = set()
    lm.tokenizer.eos_token_ids = set()
    C.warm_up(engine)
    chunk = engine.chunk
    variants = ["engine", "mlx_lm", "engine_nocache"]
    runs: dict[str, list] = {v: [] for v in variants}
    identical = True
    for rep in range(reps):
        msgs = C.messages_for_length(engine, prompt_len, salt=1000 + rep)
        ids = engine.prompt_ids(msgs)
        order = variants[rep % 3:] + variants[: rep % 3]
        seen = []
        for v in order:
            # The previous engine run's snapshot writes finish first, as they do while a user reads
            # the reply; otherwise they land on whichever run comes next (item 4 measures them).
            if engine.cache.disk is not None:
                engine.cache.disk.flush()
            if v == "mlx_lm":
                r = run_mlx_lm(engine, ids, n_tokens, chunk)
            else:
                r = run_engine(engine, msgs, n_tokens, use_cache=(v == "engine"))
            runs[v].append(r)
            seen.append(r["tokens"])
            C.log(f"  {model} rep {rep} {v:15s} prompt={r['prompt']} prefill {r['prefill_tps']:.1f} tok/s, "
                  f"decode {r['decode_tps']:.2f} tok/s ({r['n']} tokens)")
        identical &= all(s == seen[0] for s in seen)
    engine.close()
    info = engine.info
    return {"runs": runs, "identical": identical, "chunk": chunk, "dequantized": info.dequantized,
            "prompt": runs["engine"][0]["prompt"], "tokens": n_tokens}


def main() -> None:
    args = C.bench_args(__doc__.splitlines()[0], _extra)
    C.ensure_openblas()
    t0 = time.perf_counter()
    prompt_len = QUICK_PROMPT if args.quick else PROMPT
    reps_for = {"demo": 7, "tiny": 7}
    res = C.Result(2, "decode_vs_mlx_lm", "Engine tokens/s / mlx-lm stream_generate (same model object)",
                   C.command_line("decode_vs_mlx_lm.py", args.quick))
    rows = []
    for model in args.models:
        reps = 2 if args.quick else (args.reps or reps_for.get(model, 5))
        C.log(f"{model}: engine vs mlx-lm, {reps} interleaved repetitions")
        d = measure(model, prompt_len, args.tokens, reps)
        res.data[model] = {k: v for k, v in d.items()}
        med = {v: (C.median([r["prefill_tps"] for r in rs]), C.median([r["decode_tps"] for r in rs]))
               for v, rs in d["runs"].items()}
        runs = d["runs"]

        def paired(v: str, k: str) -> float:
            # median over repetitions of (engine / mlx-lm) measured back to back: the machine's
            # load drifts between repetitions, so pairs are steadier than a ratio of medians
            return C.median([a[k] / b[k] for a, b in zip(runs[v], runs["mlx_lm"])])
        label = C.MODEL_LABELS.get(model, model) + (" (weights f32 at load)" if d["dequantized"] else "")
        dec, pre = paired("engine", "decode_tps"), paired("engine", "prefill_tps")
        dec_nc, pre_nc = paired("engine_nocache", "decode_tps"), paired("engine_nocache", "prefill_tps")
        whole = C.median([b["total_s"] / a["total_s"] for a, b in zip(runs["engine"], runs["mlx_lm"])])
        rows.append([label, d["prompt"], d["tokens"],
                     f"{med['mlx_lm'][1]:.2f}", f"{med['engine'][1]:.2f}", f"**{dec:.3f}**", f"{dec_nc:.3f}",
                     f"{med['mlx_lm'][0]:.1f}", f"{med['engine'][0]:.1f}", f"**{pre:.3f}**", f"{pre_nc:.3f}",
                     f"{whole:.3f}", "yes" if d["identical"] else "**no**"])
        res.target(f"decode tok/s engine / mlx-lm, {model}", dec, 0.97, at_most=False)
        res.target(f"prefill tok/s engine / mlx-lm, {model} (chunk {d['chunk']})", pre, 0.97, at_most=False)
    res.tables.append(C.md_table(
        ["model", "prompt", "tokens", "mlx-lm decode tok/s", "engine decode tok/s", "decode ratio",
         "ratio, engine cache off", "mlx-lm prefill tok/s", "engine prefill tok/s", "prefill ratio",
         "ratio, engine cache off", "whole call, mlx-lm time / engine time", "same tokens"], rows))
    res.notes.append(
        f"{', '.join(f'{m}: {reps_for.get(m, 5)}' for m in args.models) if not args.quick else 2} interleaved repetitions (order rotated), each on a fresh prompt of the same length; tok/s columns "
        "are medians, ratios are medians of the per-repetition ratios (engine run / mlx-lm run of the same "
        "repetition, back to back). "
        "Decode tok/s counts from the third token to the last (steady state on both sides; see the script's "
        "docstring), prefill tok/s is prompt tokens / time to the first token handed out. The engine figures "
        "include everything the engine does on the way (templating, prompt cache lookup, the pre-last "
        "snapshot after prefill, text streaming, per-token logprobs); the whole-call column also includes the "
        "end snapshot taken after the last token (its disk write runs on the background thread). "
        "'cache off' is the same engine with `use_cache=False`. mlx-lm: `stream_generate(model, "
        "tokenizer, prompt=ids, max_tokens=N, prefill_step_size=512)`, greedy (its default sampler); "
        "its own default prefill step is 2048.")
    C.finish(res, args, t0)


def _extra(p) -> None:
    p.add_argument("--models", nargs="+", default=["demo", "tiny"])
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--reps", type=int, default=0, help="repetitions (default: demo 3, tiny 7)")


if __name__ == "__main__":
    main()
