"""Item 3: exact mode's cost over a 6-turn conversation: prefill tokens and time, exact vs fast vs no cache.

One engine per model; three prompt caches (memory tier), one per mode, swapped in turn by turn,
so the modes never share snapshots. Each mode carries its own conversation: the same six user
messages, each followed by the reply that mode generated (greedy). Turns are interleaved across
modes (order rotated per turn). Exact mode must give the same replies as no cache (G3); fast mode
reuses decoded tokens, so its replies may differ in the low bits (reported).
Prefill time = the sum over the six turns of time to first token (restore + prefill + the last
prompt token's forward).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common as C  # noqa: E402

TURNS = 6
SETTINGS = {"demo": (100, 16), "tiny": (200, 16)}  # model: (user tokens per turn, reply max tokens)
MODES = ("none", "exact", "fast")


def measure(model: str, quick: bool) -> dict:
    from engine.cache.prompt_cache import PromptCache
    from engine.types import GenerationRequest, SamplerSettings

    engine, _ = C.load_engine(model, use_disk=False)
    C.warm_up(engine)
    user_tokens, reply_tokens = SETTINGS.get(model, (150, 16))
    turns = 3 if quick else TURNS
    caches = {m: PromptCache(engine.cache.budget_bytes) for m in MODES}
    convs: dict[str, list] = {m: [] for m in MODES}
    out: dict[str, list] = {m: [] for m in MODES}
    for t in range(turns):
        user = {"role": "user", "content": f"Turn {t + 1}. " + C.text_of_tokens(engine, user_tokens, salt=300 + t)}
        order = MODES[t % 3:] + MODES[: t % 3]
        for mode in order:
            conv = convs[mode] + [user]
            engine.cache = caches[mode]
            req = GenerationRequest(conv, SamplerSettings(max_tokens=reply_tokens),
                                    mode="fast" if mode == "fast" else "exact", use_cache=mode != "none")
            r = engine.generate(req)
            rep = r.report
            out[mode].append({"prompt": rep.prompt_tokens, "restored": rep.restored, "prefill": rep.prefill_tokens,
                              "ttft": rep.ttft_s, "tokens": r.tokens})
            convs[mode] = conv + [{"role": "assistant", "content": r.text}]
            C.log(f"  {model} turn {t + 1} {mode:5s} prompt={rep.prompt_tokens} restored={rep.restored} "
                  f"prefill={rep.prefill_tokens} ttft={C.fmt_s(rep.ttft_s)}")
    engine.close()
    return {"runs": out, "user_tokens": user_tokens, "reply_tokens": reply_tokens, "turns": turns,
            "chunk": engine.chunk}


def main() -> None:
    args = C.bench_args(__doc__.splitlines()[0], lambda p: p.add_argument("--models", nargs="+", default=["demo", "tiny"]))
    C.ensure_openblas()
    t0 = time.perf_counter()
    res = C.Result(3, "exact_cost", "Exact mode's cost over a 6-turn conversation",
                   C.command_line("exact_cost.py", args.quick))
    rows = []
    for model in args.models:
        C.log(f"{model}: {TURNS}-turn conversation, modes none/exact/fast interleaved")
        d = measure(model, args.quick)
        res.data[model] = d
        runs = d["runs"]
        base_tok = sum(r["prefill"] for r in runs["none"])
        base_s = sum(r["ttft"] for r in runs["none"])
        for mode, label in (("none", "no cache"), ("exact", "exact"), ("fast", "fast")):
            tok = sum(r["prefill"] for r in runs[mode])
            secs = sum(r["ttft"] for r in runs[mode])
            same = all(a["tokens"] == b["tokens"] for a, b in zip(runs[mode], runs["none"]))
            rows.append([C.MODEL_LABELS.get(model, model), label, runs[mode][-1]["prompt"],
                         " / ".join(str(r["prefill"]) for r in runs[mode]), tok, f"{tok / base_tok:.2f}",
                         f"{secs:.2f} s", f"**{secs / base_s:.2f}**", "yes" if same else "no"])
        ex = sum(r["ttft"] for r in runs["exact"]) / sum(r["ttft"] for r in runs["fast"])
        ex_tok = sum(r["prefill"] for r in runs["exact"]) / sum(r["prefill"] for r in runs["fast"])
        worst = max((e["prefill"] - (e["prompt"] - p["prompt"]) for p, e in zip(runs["exact"], runs["exact"][1:])),
                    default=0)
        res.notes.append(f"{C.MODEL_LABELS.get(model, model)}: exact mode costs {ex:.2f}x fast mode's prefill "
                         f"time and {ex_tok:.2f}x its prefill tokens over the conversation ({d['user_tokens']}-token "
                         f"user turns, replies up to {d['reply_tokens']} tokens, chunk C = {d['chunk']}); on turns "
                         f"after the first, exact mode prefilled at most {worst} tokens more than the previous "
                         f"reply, the new message and the template's headers.")
    res.tables.append(C.md_table(
        ["model", "mode", "final prompt tokens", "prefill tokens per turn", "total prefill tokens",
         "tokens / no cache", "total prefill time (sum of TTFT)", "time / no cache", "replies = no-cache replies"],
        rows))
    res.notes.append(
        "Exact mode cuts every prefill at multiples of C and at message boundaries, and restores the "
        "state at the start of the previous reply (a cut that turn shared with this one); it re-prefills "
        "the previous reply (decoded tokens are never bit-equal to prefilled ones), the new message and "
        "the headers, so its replies are bit-identical to a run with no cache. Fast mode reuses the "
        "previous turn's end snapshot (prompt + reply) and prefills only the new user turn.")
    C.finish(res, args, t0)


if __name__ == "__main__":
    main()
