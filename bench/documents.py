"""Documents read once (issue 38): a ~6k-token document on the demo model.

Process A (fresh cache dir): the first question about the document (cold: its whole prompt is
prefilled), then a second question in a NEW conversation with the same system prompt and
document (memory tier), the same second conversation with no cache (the cold reference), and a
conversation with the question alone (no document: what the question's own prefill costs).
The disk writes are flushed after the first conversation, so the folder's size after one
conversation is known. Process B (a restart, same folder): a third question in a new
conversation (disk tier) and its cold reference. Process C (fresh folder): the second
conversation alone, for what it would cost on disk without the first.

Reported: TTFT of the second and third questions against the cold first one (ratio in one run)
and against the question's own prefill plus one decode step; restored against the system prompt
and document tokens; each reply equal to its cold run; the folder's bytes for two conversations
about one document against one conversation plus the second's own turns.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common as C  # noqa: E402

DOC_TOKENS = 6000
QUICK_DOC_TOKENS = 1500
MAX_TOKENS = 8
SYSTEM = "You are a helpful assistant. Answer from the document."
QUESTIONS = ("What is the first section about?", "Summarise the document in one sentence.",
             "Which words come up most often?", "What does the last section say?")


def _extra(p) -> None:
    p.add_argument("--child", action="store_true")
    p.add_argument("--phase", choices=["first", "restart", "restart-unread", "alone"])
    p.add_argument("--cache-dir")
    p.add_argument("--doc-tokens", type=int, default=DOC_TOKENS)


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def child(args) -> dict:
    from engine.documents.extract import document_from_bytes
    from engine.types import GenerationRequest, SamplerSettings

    cache_dir = Path(args.cache_dir)
    engine, _ = C.load_engine("demo", cache_dir=cache_dir)
    C.warm_up(engine)
    doc = document_from_bytes("report.md", C.text_of_tokens(engine, args.doc_tokens, salt=38).encode())

    def request_for(q: str, docs=(doc,), use_cache: bool = True) -> GenerationRequest:
        return GenerationRequest([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
                                 SamplerSettings(max_tokens=MAX_TOKENS), use_cache=use_cache, documents=tuple(docs))

    def ask(q: str, docs=(doc,), use_cache: bool = True) -> dict:
        r = engine.generate(request_for(q, docs, use_cache))
        rep = r.report
        d = rep.documents[0] if rep.documents else {}
        out = {"q": q, "ttft": rep.ttft_s, "prompt": rep.prompt_tokens, "restored": rep.restored,
               "source": rep.source, "prefill": rep.prefill_tokens, "tokens": r.tokens,
               "doc_end": d.get("end"), "doc_tokens": d.get("tokens"), "doc_source": d.get("source"),
               "step": 1 / rep.decode_tps if rep.decode_tps else None}
        C.log(f"  {args.phase} {q[:30]!r} use_cache={use_cache} ttft={C.fmt_s(rep.ttft_s)} "
              f"restored={rep.restored}/{rep.prompt_tokens} source={rep.source}")
        return out

    out: dict = {}
    if args.phase == "first":
        out["first"] = ask(QUESTIONS[0])
        engine.cache.disk.flush()  # every write on disk: the folder after one conversation
        out["bytes_one"] = _folder_bytes(cache_dir)
        out["second"] = ask(QUESTIONS[1])
        out["second_cold"] = ask(QUESTIONS[1], use_cache=False)
        out["question_alone"] = ask(QUESTIONS[1], docs=(), use_cache=False)
        out["in_place"] = C.in_place(engine, request_for(QUESTIONS[1]), out["second"]["restored"])
        engine.close()
        out["bytes_two"] = _folder_bytes(cache_dir)
    elif args.phase == "restart":  # as the window does: the documents' states read ahead, then asked
        t = time.perf_counter()
        out["preloaded"] = engine.preload_documents()
        out["preload_s"] = time.perf_counter() - t
        out["third"] = ask(QUESTIONS[2])
        out["third_cold"] = ask(QUESTIONS[2], use_cache=False)
        engine.close()
    elif args.phase == "restart-unread":  # asked at once, nothing read ahead: the disk is read then
        out["third"] = ask(QUESTIONS[3])
        engine.close()
    else:  # the second conversation alone, in a folder of its own
        out["second_alone"] = ask(QUESTIONS[1])
        engine.close()
        out["bytes_alone"] = _folder_bytes(cache_dir)
    return out


def main() -> None:
    args = C.bench_args(__doc__.splitlines()[0], _extra)
    if args.child:
        C.ensure_openblas()
        print(json.dumps(child(args)))
        return
    C.ensure_openblas()
    t0 = time.perf_counter()
    n_doc = QUICK_DOC_TOKENS if args.quick else args.doc_tokens
    res = C.Result(38, "documents", "Documents read once: a new conversation, and a restart, start at the question",
                   C.command_line("documents.py", args.quick))
    env = C.env_with_blas(True)
    shared, alone = C.BUILD / "documents-cache", C.BUILD / "documents-cache-alone"
    for d in (shared, alone):
        shutil.rmtree(d, ignore_errors=True)
    base = [__file__, "--child", "--doc-tokens", str(n_doc)]
    C.log("process A: first question (cold), a second in a new conversation")
    a = C.run_json_child(base + ["--phase", "first", "--cache-dir", str(shared)], env)
    C.log("process B: a restart, a third question in a new conversation")
    b = C.run_json_child(base + ["--phase", "restart", "--cache-dir", str(shared)], env)
    C.log("process B2: another restart, the third question asked with nothing read ahead")
    b2 = C.run_json_child(base + ["--phase", "restart-unread", "--cache-dir", str(shared)], env)
    C.log("process C: the second conversation alone")
    c = C.run_json_child(base + ["--phase", "alone", "--cache-dir", str(alone)], env)
    for d in (shared, alone):
        shutil.rmtree(d, ignore_errors=True)
    res.data = {"A": a, "B": b, "B2": b2, "C": c, "doc_tokens_asked": n_doc}

    first, second, third, unread = a["first"], a["second"], b["third"], b2["third"]
    own = a["in_place"]["scheduled"]  # the question's own prefill where it is (its exact forwards) + one step
    one = a["in_place"]["one_forward"]  # the question in one forward + one step
    alone = a["question_alone"]["ttft"] + (second["step"] or 0.0)  # a cold run of the question without the document
    problems = []
    for run, cold, source in ((second, a["second_cold"], "memory"), (third, b["third_cold"], "disk")):
        if run["tokens"] != cold["tokens"]:
            problems.append(f"{run['q']!r}: the reply differs from its cold run")
        if run["source"] != source or run["restored"] < run["doc_end"]:
            problems.append(f"{run['q']!r}: restored {run['restored']} from {run['source']}, document ends at "
                            f"{run['doc_end']}")
    rows = []
    for label, run in (("first question (cold)", first), ("second, new conversation (memory)", second),
                       (f"third, after a restart, the document's state read ahead ({C.fmt_s(b['preload_s'])} at start)",
                        third),
                       ("third, after a restart, asked at once (nothing read ahead)", unread)):
        rows.append([label, run["prompt"], run["restored"], run["doc_end"], run["doc_source"], run["prefill"],
                     C.fmt_s(run["ttft"]), C.fmt_ratio(C.ratio(run["ttft"], first["ttft"])),
                     C.fmt_ratio(C.ratio(run["ttft"], own)), C.fmt_ratio(C.ratio(run["ttft"], one)),
                     C.fmt_ratio(C.ratio(run["ttft"], alone))])
    res.tables.append(C.md_table(
        ["run", "prompt tokens", "restored", "document ends at", "document's state", "prefilled", "TTFT",
         "TTFT / cold first", "TTFT / (question's own prefill + 1 step)", "… / (question in one forward + 1 step)",
         "… / (question without the document, cold, + 1 step)"], rows))
    res.tables.append(C.md_table(
        ["the question where it is, the document's state live (best of 3)", "time"],
        [[f"its {a['in_place']['forwards']} forwards as the exact schedule makes them + 1 step", C.fmt_s(own)],
         ["its tokens in one forward + 1 step", C.fmt_s(one)],
         ["a cold run of the question without the document + 1 step", C.fmt_s(alone)]]))
    own_turns = c["bytes_alone"] * (second["prompt"] - second["doc_end"]) / second["prompt"]
    disk_ratio = C.ratio(a["bytes_two"], a["bytes_one"] + own_turns)
    apart = C.ratio(a["bytes_two"], a["bytes_one"] + c["bytes_alone"])
    res.tables.append(C.md_table(
        ["cache folder", "bytes"],
        [["after one conversation", C.fmt_bytes(a["bytes_one"])],
         ["after two conversations about the document", C.fmt_bytes(a["bytes_two"])],
         ["the second conversation alone (own folder)", C.fmt_bytes(c["bytes_alone"])],
         ["two / (one + the second's own turns)", f"**{C.fmt_ratio(disk_ratio)}**"],
         ["two / (one + the second alone): against storing them apart", C.fmt_ratio(apart)]]))
    res.target("second question TTFT / (question's own prefill + one step), memory",
               C.ratio(second["ttft"], own), 1.0)
    res.target("third question TTFT / (question's own prefill + one step), after a restart (read ahead)",
               C.ratio(third["ttft"], own), 1.0)
    res.target("third question TTFT / (question's own prefill + one step), after a restart, asked at once",
               C.ratio(unread["ttft"], own), 1.0)
    res.target("disk: two conversations / (one + the second's own turns)", disk_ratio, 1.1)
    res.notes.append(
        f"Demo model ({C.DEMO_LABEL}), a {first['doc_tokens']}-token Markdown document after a "
        f"{len(SYSTEM)}-character system prompt, {MAX_TOKENS} tokens per reply, exact mode. \"The question's "
        "own prefill + 1 step\" is timed where the question is: on a live cache that already holds the system "
        "prompt and the document (prefilled untimed), the question's forwards as the exact schedule makes them "
        "(the same the warm run makes), then one decode step: what is left once the document costs nothing, so "
        "the ratio is the restore's own cost. The two other baselines: the question's tokens in one forward, and "
        "a cold run of the question without the document (what an earlier version of this benchmark used; its "
        "tokens attend over a few dozen positions, not the document's thousands). The second's own turns "
        "are its folder's bytes in proportion to its tokens past the document's end.")
    if problems:
        res.status = "failed"
        res.notes.extend(problems)
    else:
        res.notes.append("Every reply equals its cold run (same token ids); every new conversation restored "
                         "at least the system prompt and the document.")
    C.finish(res, args, t0)
    if problems:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
