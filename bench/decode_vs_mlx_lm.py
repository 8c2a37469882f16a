"""Item 2: engine decode and prefill tokens/s / mlx-lm's `stream_generate`, same model object.

One process per model. The engine is loaded as usual (on the CPU backend with OpenBLAS the demo
model's 4-bit weights are expanded to f32 at load); mlx-lm's `stream_generate` then runs on the
very same `model` and tokenizer objects, so both sides do identical arithmetic. Same prompt token
ids, greedy, the same number of tokens (EOS ignored on both sides so every run produces exactly
`--tokens`), and mlx-lm's `prefill_step_size` set to the engine's chunk (512; mlx-lm's own default
is 2048). mlx-lm prefills `prompt[:-1]` in steps from position 0 and forwards the last token with
the first decode step, which is exactly the engine's cold-run schedule, so the tokens must match.

Both sides are timed the same way from outside: t0 = call, t_first = first token available,
t_end = generator/generate done. prefill tok/s = prompt tokens / (t_first - t0);
decode tok/s = (tokens - 1) / (t_end - t_first). The engine runs with its prompt cache on
(the default: it also takes the pre-last and end snapshots) and, as a control, with
`use_cache=False`. Each repetition uses a fresh prompt of the same length (so the cache never
hits); variants are interleaved and their order rotates between repetitions.
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
    import engine.engine as E
    from engine.settings import GenerationRequest, SamplerSettings

    inner = E.generate
    marks: dict = {}

    def timed(*a, **k):
        marks["t0"] = time.perf_counter()
        r = inner(*a, **k)
        marks["t_end"] = time.perf_counter()
        return r

    E.generate = timed
    try:
        r = engine.generate(GenerationRequest(msgs, SamplerSettings(max_tokens=n_tokens), use_cache=use_cache))
    finally:
        E.generate = inner
    t_first = marks["t0"] + r.report.ttft_s  # ttft_s is measured from the same instant
    return _rates(len(r.prompt_ids), len(r.tokens), marks["t0"], t_first, marks["t_end"], r.tokens)


def run_mlx_lm(engine, ids, n_tokens: int, chunk: int) -> dict:
    from mlx_lm import stream_generate

    lm = engine.lm
    t0 = time.perf_counter()
    t_first = None
    tokens = []
    for resp in stream_generate(lm.model, lm.tokenizer, prompt=ids, max_tokens=n_tokens, prefill_step_size=chunk):
        if t_first is None:
            t_first = time.perf_counter()
        tokens.append(int(resp.token))
    t_end = time.perf_counter()
    return _rates(len(ids), len(tokens), t0, t_first, t_end, tokens)


def _rates(n_prompt: int, n_tokens: int, t0: float, t_first: float, t_end: float, tokens) -> dict:
    return {
        "prompt": n_prompt,
        "n": n_tokens,
        "prefill_tps": n_prompt / (t_first - t0),
        "decode_tps": (n_tokens - 1) / (t_end - t_first) if n_tokens > 1 else float("nan"),
        "ttft": t_first - t0,
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
    reps_for = {"demo": 3, "tiny": 7}
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
        rows.append([label, d["prompt"], d["tokens"],
                     f"{med['mlx_lm'][1]:.2f}", f"{med['engine'][1]:.2f}", f"**{dec:.3f}**", f"{dec_nc:.3f}",
                     f"{med['mlx_lm'][0]:.1f}", f"{med['engine'][0]:.1f}", f"**{pre:.3f}**", f"{pre_nc:.3f}",
                     "yes" if d["identical"] else "**no**"])
        res.target(f"decode tok/s engine / mlx-lm, {model}", dec, 0.97, at_most=False)
        res.target(f"prefill tok/s engine / mlx-lm, {model} (chunk {d['chunk']})", pre, 0.97, at_most=False)
    res.tables.append(C.md_table(
        ["model", "prompt", "tokens", "mlx-lm decode tok/s", "engine decode tok/s", "decode ratio",
         "ratio, engine cache off", "mlx-lm prefill tok/s", "engine prefill tok/s", "prefill ratio",
         "ratio, engine cache off", "same tokens"], rows))
    res.notes.append(
        f"{', '.join(f'{m}: {reps_for.get(m, 5)}' for m in args.models) if not args.quick else 2} interleaved repetitions (order rotated), each on a fresh prompt of the same length; tok/s columns "
        "are medians, ratios are medians of the per-repetition ratios (engine run / mlx-lm run of the same "
        "repetition, back to back). "
        "The engine figures include everything the engine does on the way (prompt cache lookup, the "
        "pre-last snapshot after prefill, the end snapshot after decode, both also written to the disk tier by its "
        "background thread, text streaming, per-token "
        "logprobs); 'cache off' is the same engine with `use_cache=False`. mlx-lm: `stream_generate(model, "
        "tokenizer, prompt=ids, max_tokens=N, prefill_step_size=512)`, greedy (its default sampler); "
        "its own default prefill step is 2048.")
    C.finish(res, args, t0)


def _extra(p) -> None:
    p.add_argument("--models", nargs="+", default=["demo", "tiny"])
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--reps", type=int, default=0, help="repetitions (default: demo 3, tiny 7)")


if __name__ == "__main__":
    main()
