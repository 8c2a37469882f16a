"""Time to first token of a follow-up (~394 new tokens) as the context grows: the engine and
mlx-lm alone, the same tokens on the same model object.

For each context size: the engine answers a first message of about that many tokens (the prompt
cache keeps the state), then a follow-up of --new tokens, a new one per repetition, each with the
memory tier as the first turn left it (an earlier follow-up's state would serve more of the next
one), so each restores the same point and prefills the same amount. The engine restores the first turn's state and prefills the rest (in
exact mode its reply too, whose decoded state is never reused). mlx-lm's
`stream_generate` gets the very same tokens after the very same restored prefix: its KV cache
holds that prefix (prefilled once, untimed, cut back after each run) and it prefills the rest in
512-token steps (the engine's chunk) and samples one token. Prefill tok/s = prefilled tokens /
time to the first token. The best of --reps repetitions (the machine is shared), the two sides
interleaved; and each side's CPU time to its first token (all its threads: what another
process's load does not add), the median over the repetitions.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 PYTHONPATH=. \\
        .venv/bin/python bench/followup_ttft.py [--contexts 300 1000 2600 5000] [--reps 3]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common as C  # noqa: E402


def mlx_lm_followup(engine, ids: list[int], restored: int, cache) -> float:
    """Seconds to mlx-lm's first token for ids[restored:] after `cache` (holding ids[:restored])."""
    from mlx_lm import stream_generate

    lm = engine.lm
    t0 = time.perf_counter()
    for _ in stream_generate(lm.model, lm.tokenizer, prompt=ids[restored:], prompt_cache=cache, max_tokens=1,
                             prefill_step_size=engine.chunk):
        break
    took = time.perf_counter() - t0
    for c in cache:  # back to the restored prefix for the next run
        c.trim(c.offset - restored)
    return took


def prefilled_cache(engine, ids: list[int]):
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(engine.lm.model)
    for a in range(0, len(ids), engine.chunk):
        engine.lm.model(mx.array([ids[a:a + engine.chunk]]), cache=cache)
        mx.eval([c.state for c in cache])
    return cache


def main() -> None:
    args = C.bench_args(__doc__.splitlines()[0], _extra)
    C.ensure_openblas()
    t0 = time.perf_counter()
    from engine.cache.snapshot import Snapshot
    from engine.types import GenerationRequest, SamplerSettings

    contexts, reps = ([300], 1) if args.quick else (args.contexts, args.reps)
    engine, _ = C.load_engine("demo", use_disk=False)
    engine.lm.eos_ids = set()
    C.warm_up(engine)
    rows, data = [], []
    for ctx in contexts:
        first = [{"role": "user", "content": C.text_of_tokens(engine, ctx, 5000 + ctx)}]
        reply = engine.generate(GenerationRequest(first, SamplerSettings(max_tokens=16))).text
        # The first turn's snapshots, as they were after it: what every follow-up starts from.
        kept = [Snapshot(m, engine.cache.memory.cache_of(m.id)) for m in engine.cache.metas()]
        cache, cached_for = None, None
        best: dict[str, tuple[float, int, int, int]] = {}
        cpus: dict[str, list[float]] = {}
        for rep in range(reps):
            msgs = first + [{"role": "assistant", "content": reply},
                            {"role": "user", "content": C.text_of_tokens(engine, args.new, 7000 + ctx * 10 + rep)}]
            ids = engine.prompt_ids(msgs)
            for side in (["engine", "mlx-lm"] if rep % 2 == 0 else ["mlx-lm", "engine"]):
                if side == "engine":
                    engine.cache.memory.clear()  # an earlier follow-up's state would serve more of this one
                    for snap in kept:
                        engine.cache.put(snap, persist=False)
                    cpu = time.process_time()
                    r = engine.generate(GenerationRequest(msgs, SamplerSettings(max_tokens=1)))
                    cpu = time.process_time() - cpu
                    restored, s = r.report.restored, r.report.ttft_s
                    cached_for = cached_for if cached_for is not None else restored
                    assert restored == cached_for, "every repetition restores the same point"
                else:  # after the engine's first run (repetition 0 starts with it): the same restore point
                    if cache is None:
                        cache = prefilled_cache(engine, ids[:cached_for])
                    restored = cached_for
                    cpu = time.process_time()
                    s = mlx_lm_followup(engine, ids, restored, cache)
                    cpu = time.process_time() - cpu
                C.log(f"context {ctx} rep {rep} {side:7s}: prompt {len(ids)}, restored {restored}, "
                      f"prefilled {len(ids) - restored}, first token {s:.2f} s, CPU {cpu:.2f} s")
                cpus.setdefault(side, []).append(cpu)
                if side not in best or s < best[side][0]:
                    best[side] = (s, len(ids), restored, len(ids) - restored)
        e, m = best["engine"], best["mlx-lm"]
        assert (e[1], e[2]) == (m[1], m[2]), "both sides must prefill the same tokens"
        ce, cm = C.median(cpus["engine"]), C.median(cpus["mlx-lm"])
        rows.append([f"{e[2]:,}", f"{e[1]:,}", e[3], C.fmt_s(m[0]), f"{m[3] / m[0]:.0f}", C.fmt_s(e[0]),
                     f"{e[3] / e[0]:.0f}", C.fmt_ratio(m[0] / e[0]), f"{cm:.2f}", f"{ce:.2f}", C.fmt_ratio(ce / cm)])
        data.append({"context": ctx, "engine": e, "mlx_lm": m, "cpu": cpus})
    engine.close()
    res = C.Result(7, "followup_ttft", "A follow-up's time to first token as the context grows: mlx-lm alone and the engine",
                   C.command_line("followup_ttft.py", args.quick, f"--reps {reps}"))
    res.tables.append(C.md_table(
        ["context restored", "prompt", "tokens prefilled", "mlx-lm TTFT", "mlx-lm prefill tok/s", "engine TTFT",
         "engine prefill tok/s", "engine speed / mlx-lm", "mlx-lm CPU s", "engine CPU s", "engine CPU / mlx-lm"],
        rows))
    res.notes.append(f"{C.DEMO_LABEL}, exact mode, disk tier off, greedy; the best of {reps} repetitions per side "
                     "(interleaved), each a new follow-up message of the same length after the same first turn.")
    res.data = {"rows": data}
    C.finish(res, args, t0)


def _extra(p) -> None:
    p.add_argument("--contexts", type=int, nargs="+", default=[300, 1000, 2600, 5000])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--new", type=int, default=394, help="tokens of the follow-up message")


if __name__ == "__main__":
    main()
