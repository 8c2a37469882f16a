"""A harness's prompt prefilled once, ever (issue 47): Codex CLI's and Claude Code's real first
requests (recorded through the test proxy: tests/clients/harnesses/*-first-request.json).

Each request goes through its wire format's parser (engine/serve/formats/: what `engine serve`
does with its body) to the engine. The model: the tests' harness model (the tool template, a
tokenizer trained on these requests too, so they take ~11k and ~14k tokens, about what a real
model's tokenizer makes of them) with the tiny tool model's body (hidden 256, 4 layers), where
a prefill of that length costs seconds.

Per harness, process A (fresh cache folder): the first session (cold: its whole prompt
prefilled), then a second session asking something else (memory tier), and what that second
session's own tokens cost where they are (bench/common.py, `in_place`: a live cache of everything
it restored, prefilled untimed, then its own forwards + one decode step, timed). Process B (a
restart, same folder): the kept states read ahead as `engine serve` does at start
(Engine.preload_documents), then a third session. Process B2 (another restart): the third
session asked at once, nothing read ahead. B and B2 alternate, three times each (medians).

Reported: each session's time to first token (from handing the request to the engine, its
prompt's rendering included, to the first token), restored tokens and where from, against the
cold first session and against the session's own prefill + 1 decode step; each reply equal to its
cold run (token ids).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common as C  # noqa: E402

MAX_TOKENS = 8
SEED = 0
PROMPTS = ("Say hello.", "Name three rivers.", "What does this repository do?", "List the files here.")
BODY = dict(hidden_size=256, num_hidden_layers=4, intermediate_size=512, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64)
QUICK_BODY = dict(hidden_size=128, num_hidden_layers=2, intermediate_size=256, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=64)
KINDS = ("codex", "claude")


def _extra(p) -> None:
    p.add_argument("--child", action="store_true")
    p.add_argument("--kind", choices=KINDS)
    p.add_argument("--phase", choices=["first", "restart", "restart-unread"])
    p.add_argument("--cache-dir")
    p.add_argument("--model-dir")
    p.add_argument("--reps", type=int, default=3, help="restarts of each kind (the median is reported)")
    p.add_argument("--verify", action="store_true", help="child: also a cold run of the session (exactness)")
    p.add_argument("--question", help="child: the session's question (each restart asks a new one)")


def request_for(kind: str, prompt: str, use_cache: bool = True) -> Any:
    """The recorded first request of `kind`, asking `prompt`, as the engine's request."""
    from engine.serve.formats import messages, responses
    from engine.serve.schema import Defaults
    from tests import harness_runs as H

    recorded = H.recorded(kind)
    body = H.replace_prompt(kind, recorded["body"], recorded["prompt"], prompt)
    defaults = Defaults(seed=SEED)
    if kind == "codex":
        req = responses.resolve(responses.parse(body, defaults), None).request
    else:
        req = messages.parse(body, defaults).request
    return replace(req, sampler=replace(req.sampler, max_tokens=MAX_TOKENS), use_cache=use_cache)


def ask(engine: Any, kind: str, prompt: str, phase: str, use_cache: bool = True) -> dict:
    """One session's first request: time to first token from handing it over, and its report."""
    from engine.types import TokenEvent

    req = request_for(kind, prompt, use_cache)
    t = time.perf_counter()
    events = engine.stream(req)
    ttft = None
    while True:
        try:
            e = next(events)
        except StopIteration as done:
            result = done.value
            break
        if ttft is None and isinstance(e, TokenEvent):
            ttft = time.perf_counter() - t
    rep = result.report
    lead = next(i for i, m in enumerate(req.messages) if m["role"] != "system")  # the system turn's messages
    system_end = rep.message_starts[lead - 1] if 0 < lead <= len(rep.message_starts) else None
    C.log(f"  {kind} {phase} {prompt!r} use_cache={use_cache} ttft={C.fmt_s(ttft or 0.0)} "
          f"restored={rep.restored}/{rep.prompt_tokens} source={rep.source}")
    return {"prompt_text": prompt, "ttft": ttft, "engine_ttft": rep.ttft_s, "prompt": rep.prompt_tokens,
            "restored": rep.restored, "source": rep.source, "prefill": rep.prefill_tokens, "tokens": result.tokens,
            "system_end": system_end, "step": 1 / rep.decode_tps if rep.decode_tps else None}


def baselines(engine: Any, kind: str, prompt: str, run: dict) -> dict:
    """The session's two baselines (C.in_place, best of 3): its own tokens' prefill from the system
    turn's end, and the prefill of what it did not restore (the same when it restored just that)."""
    req = request_for(kind, prompt)
    own = C.in_place(engine, req, run["system_end"])["scheduled"]
    rest = own if run["restored"] == run["system_end"] else C.in_place(engine, req, run["restored"])["scheduled"]
    return {"own": own, "rest": rest}


def child(args) -> dict:
    from engine.engine import Engine

    engine = Engine(cache_dir=Path(args.cache_dir), chunk=512, context_length=131072)
    engine.load(args.model_dir)
    C.warm_up(engine)
    kind = args.kind
    out: dict = {}
    if args.phase == "first":
        out["first"] = ask(engine, kind, PROMPTS[0], "first")
        engine.cache.disk.flush()  # its states written: the next session is not asked mid-write
        out["run"] = ask(engine, kind, PROMPTS[1], "second")
        out["cold"] = ask(engine, kind, PROMPTS[1], "second", use_cache=False)
        out.update(baselines(engine, kind, PROMPTS[1], out["run"]))
    elif args.phase == "restart":  # as `engine serve` does at start: the kept states read ahead
        t = time.perf_counter()
        out["preloaded"] = engine.preload_documents()
        out["preload_s"] = time.perf_counter() - t
        out["run"] = ask(engine, kind, args.question, "restart")
        if args.verify:
            out["cold"] = ask(engine, kind, args.question, "restart", use_cache=False)
        out.update(baselines(engine, kind, args.question, out["run"]))
    else:  # asked at once, nothing read ahead: the disk is read then
        out["run"] = ask(engine, kind, args.question, "restart-unread")
    engine.close()
    return out


def main() -> None:
    args = C.bench_args(__doc__.splitlines()[0], _extra)
    if args.child:
        C.ensure_openblas()
        print(json.dumps(child(args)))
        return
    C.ensure_openblas()
    from tests import harness_runs as H
    from tests.tiny_models import build_harness_model

    t0 = time.perf_counter()
    body = QUICK_BODY if args.quick else BODY
    reps = 1 if args.quick else args.reps
    model = build_harness_model(C.MODELS / ("harness-quick" if args.quick else "harness"), trained=True, **body)
    res = C.Result(47, "harness_prefix", "A harness's prompt prefilled once: a new session, and a restart",
                   C.command_line("harness_prefix.py", args.quick))
    env = C.env_with_blas(True)
    rows, problems, data = [], [], {}
    for kind in KINDS:
        cache = C.BUILD / f"harness-cache-{kind}"
        shutil.rmtree(cache, ignore_errors=True)
        base = [__file__, "--child", "--kind", kind, "--model-dir", str(model), "--cache-dir", str(cache)]
        C.log(f"{kind}: process A, the first session (cold) and a second one")
        a = C.run_json_child(base + ["--phase", "first"], env)
        restarts, unread = [], []
        for rep in range(reps):  # restarts alternate: read ahead, then asked at once
            C.log(f"{kind}: restart {rep + 1}/{reps}, the kept states read ahead, a third session")
            ask_new = ["--question", f"{PROMPTS[2]} ({rep + 1})"] + (["--verify"] if rep == 0 else [])
            restarts.append(C.run_json_child(base + ["--phase", "restart"] + ask_new, env))
            C.log(f"{kind}: restart {rep + 1}/{reps}, the third session asked at once")
            unread.append(C.run_json_child(base + ["--phase", "restart-unread", "--question",
                                                   f"{PROMPTS[3]} ({rep + 1})"], env))
        shutil.rmtree(cache, ignore_errors=True)
        data[kind] = {"A": a, "restarts": restarts, "unread": unread}
        first = a["first"]
        name = H.recorded(kind)["harness"]
        rows.append([f"{name}: first session (cold)", first["prompt"], first["system_end"], first["restored"],
                     first["source"], first["prefill"], C.fmt_s(first["ttft"]), "1", "", ""])
        own_b = C.median([r["own"] for r in restarts])  # the unread runs' baseline: the restarts' median
        rest_b = C.median([r["rest"] for r in restarts])
        groups = (("second session (memory)", [a], [a["own"]], [a["rest"]]),
                  (f"after a restart, read ahead ({C.fmt_s(C.median([r['preload_s'] for r in restarts]))} "
                   "at start)", restarts, [r["own"] for r in restarts], [r["rest"] for r in restarts]),
                  ("after a restart, asked at once", unread, [own_b] * len(unread), [rest_b] * len(unread)))
        ratios: dict[str, float] = {}
        for label, runs, owns, rests in groups:
            for r in runs:
                run = r["run"]
                if "cold" in r and run["tokens"] != r["cold"]["tokens"]:
                    problems.append(f"{kind} {run['prompt_text']!r}: the reply differs from its cold run")
                if run["system_end"] is None or run["restored"] < run["system_end"]:
                    problems.append(f"{kind} {run['prompt_text']!r}: restored {run['restored']}, the system turn "
                                    f"ends at {run['system_end']}")
            run = runs[0]["run"]
            ttft = C.median([r["run"]["ttft"] for r in runs])
            own = C.median([C.ratio(r["run"]["ttft"], o) for r, o in zip(runs, owns)])
            rest = C.median([C.ratio(r["run"]["ttft"], x) for r, x in zip(runs, rests)])
            ratios[label] = own
            rows.append([f"{name}: {label}" + (f" (median of {len(runs)})" if len(runs) > 1 else ""),
                         run["prompt"], run["system_end"], run["restored"], run["source"], run["prefill"],
                         C.fmt_s(ttft), C.fmt_ratio(C.ratio(ttft, first["ttft"])), C.fmt_ratio(own),
                         C.fmt_ratio(rest)])
        labels = list(ratios)
        res.target(f"{kind}: second session TTFT / (its own tokens' prefill + one step), memory",
                   ratios[labels[0]], 1.0)
        res.target(f"{kind}: a session after a restart, TTFT / (its own tokens' prefill + one step), read ahead",
                   ratios[labels[1]], 1.0)
    res.data = data
    res.tables.append(C.md_table(
        ["session", "prompt tokens", "system turn ends at", "restored", "from", "prefilled", "TTFT",
         "TTFT / cold first", "TTFT / (own tokens' prefill + 1 step)",
         "TTFT / (prefill of what it did not restore + 1 step)"], rows))
    shape = ", ".join(f"{k} {v}" for k, v in body.items())
    res.notes.append(
        f"The harness model (tests/tiny_models.py: build_harness_model, trained tokenizer) with {shape}; "
        f"{MAX_TOKENS} tokens per reply, exact mode, chunk 512, seed {SEED}. Each session is the harness's "
        "recorded first request with another question in place of the recorded one, parsed by the server's own "
        "format module. TTFT runs from handing the request to the engine (its prompt's rendering included) to "
        "the first token. A session's own tokens are those after the harness's system turn (its system prompt "
        "and tools: the kept state). Both baselines are timed where the tokens are, in the same process: on a "
        "live cache that holds everything before them (prefilled untimed), their forwards as the exact schedule "
        "makes them, then one decode step, best of 3: \"own tokens' prefill + 1 step\" from the system turn's "
        "end (what a session costs once the harness's prompt is free), and the prefill of what it did not "
        "restore (so that ratio is what the restore itself and the request's rendering cost). Each restart is "
        f"a new process ({reps} of each kind, alternating; ratios are each run's own, then the median). Claude "
        "Code puts its environment section after the question, so a new session prefills that too.")
    if problems:
        res.status = "failed"
        res.notes.extend(problems)
    else:
        res.notes.append("Every reply checked equals its cold run (same token ids); every session restored at least "
                         "the harness's system turn.")
    C.finish(res, args, t0)
    if problems:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
