"""Item 7: the per-token cost of grammar-constrained decoding (issue 30), and the grammar libraries.

On the demo model: decode with a JSON-Schema grammar (llguidance, engine/generate/constraints.py)
against the same decode unconstrained, A and B interleaved, medians of decode tokens/s. Both
decode the same number of tokens: the schema's one string has a minLength no reply reaches
within max_tokens, and EOS gets a -100 logit bias in both runs (the same sampler work). The
ratio is per-token time constrained / unconstrained (goal <= 1.10x).

Also, on the demo tokenizer (49k tokens), what each library costs to compile the schema and to
compute one token's mask, walking the same valid JSON text: llguidance 1.9.1 and outlines-core
0.2.14 (if installed; it is not a dependency). xgrammar 0.2.8 is not measured: it imports torch
to load.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common as C  # noqa: E402

SCHEMA = {"type": "object", "properties": {"story": {"type": "string", "minLength": 2000}}, "required": ["story"],
          "additionalProperties": False}
PROMPT = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper, as JSON."}]
# The library comparison: a typical schema (bounded strings, a number, a boolean) and a valid
# text to walk through it token by token (the separators both grammars are set to: ", " and ": ").
LIB_SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                               "story": {"type": "string", "maxLength": 120},
                                               "temp": {"type": "integer"}, "sunny": {"type": "boolean"}},
              "required": ["city", "story", "temp", "sunny"], "additionalProperties": False}
WALK = json.dumps({"city": "Brest", "story": "The keeper climbed the stairs every evening and lit the lamp.",
                   "temp": 14, "sunny": False})


def decode_ratio(engine: Any, reps: int, tokens: int) -> dict[str, Any]:
    from engine.constraint import Constraint
    from engine.types import GenerationRequest, SamplerSettings

    eos = sorted(engine.lm.eos_ids)
    bias = tuple((t, -100.0) for t in eos)
    settings = SamplerSettings(temperature=0.8, seed=1, max_tokens=tokens, logit_bias=bias)
    fmt = {"type": "json_schema", "json_schema": {"name": "story", "schema": SCHEMA, "strict": True}}
    requests = {"free": GenerationRequest(PROMPT, settings, use_cache=False),
                "json": GenerationRequest(PROMPT, settings, use_cache=False, constraint=Constraint.of(response_format=fmt))}
    tps: dict[str, list[float]] = {"free": [], "json": []}
    pairs: list[float] = []  # per repetition: per-token time constrained / unconstrained, run back to back
    lengths: dict[str, int] = {}
    for rep in range(reps):
        for kind in (("free", "json") if rep % 2 == 0 else ("json", "free")):
            r = engine.generate(requests[kind])
            tps[kind].append(r.report.decode_tps)
            lengths[kind] = len(r.tokens)
            C.log(f"rep {rep} {kind}: {len(r.tokens)} tokens, {r.report.decode_tps:.2f} tok/s")
        pairs.append(C.ratio(tps["free"][-1], tps["json"][-1]))
    free, guided = C.median(tps["free"]), C.median(tps["json"])
    return {"free_tps": free, "json_tps": guided, "ratio": C.median(pairs), "pairs": pairs, "tokens": lengths}


def library_costs(engine: Any, steps: int) -> list[list[Any]]:
    """Compile time and per-token mask time of each library on the demo tokenizer."""
    rows = []
    tok = engine.lm.tokenizer
    ids = tok.encode(WALK, add_special_tokens=False)[:steps]
    width = engine.builder.grammars.width
    from engine.generate.constraints import JSON_OPTIONS, Grammars
    from llguidance import LLMatcher

    g = Grammars(tok, width, engine.lm.eos_ids)
    t = time.perf_counter()
    g._lltokenizer()
    t_tok = time.perf_counter() - t
    t = time.perf_counter()
    grammar = LLMatcher.grammar_from_json_schema(LIB_SCHEMA, overrides=dict(JSON_OPTIONS))  # type: ignore[arg-type]
    guide = g.guide(grammar)
    t_compile = time.perf_counter() - t
    t = time.perf_counter()
    for i in ids:
        guide.mask()
        guide.consume(i)
    per = (time.perf_counter() - t) / len(ids)
    rows.append(["llguidance 1.9.1", C.fmt_s(t_tok), C.fmt_s(t_compile), f"{per * 1e6:.0f} µs",
                 "numpy bitmask -> one mx.where (its own MLX helper is a Metal kernel)"])
    try:
        rows.append(_outlines(tok, ids, width))
    except ImportError:
        rows.append(["outlines-core 0.2.14", "-", "-", "-", "not installed (pip install outlines-core==0.2.14)"])
    rows.append(["xgrammar 0.2.8", "-", "-", "-", "not measured: imports torch to load (and requires torch, triton)"])
    return rows


def _outlines(tok: Any, ids: list[int], width: int) -> list[Any]:
    import numpy as np
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    hf = getattr(tok, "_tokenizer", tok)
    t = time.perf_counter()
    eos = hf.eos_token_id
    vocab: dict[bytes, list[int]] = {}
    for token_id in range(len(hf)):
        if token_id == eos:
            continue
        piece = hf.convert_tokens_to_string([hf.convert_ids_to_tokens(token_id)]).encode("utf-8", "surrogatepass")
        if piece:
            vocab.setdefault(piece, []).append(token_id)
    vocabulary = Vocabulary(eos, vocab)
    t_tok = time.perf_counter() - t
    t = time.perf_counter()
    index = Index(build_regex_from_schema(json.dumps(LIB_SCHEMA), whitespace_pattern="[ ]?"), vocabulary)
    guide = Guide(index)
    t_compile = time.perf_counter() - t
    mask = np.zeros(((width + 31) // 32,), dtype=np.int32)
    t = time.perf_counter()
    done = 0
    for i in ids:
        guide.write_mask_into(mask.ctypes.data, mask.size, 4)
        try:
            guide.advance(i)
        except Exception:
            break  # a token whose text the byte map above spells differently: stop the walk there
        done += 1
    per = (time.perf_counter() - t) / max(done, 1)
    return ["outlines-core 0.2.14", C.fmt_s(t_tok), C.fmt_s(t_compile), f"{per * 1e6:.0f} µs",
            f"regex over the whole vocabulary at compile time; {done} tokens walked"]


def main() -> None:
    args = C.bench_args(__doc__ or "")
    t0 = time.perf_counter()
    C.ensure_openblas()
    engine, _ = C.load_engine("demo", use_disk=False)
    C.warm_up(engine)
    reps, tokens = (2, 16) if args.quick else (9, 32)
    d = decode_ratio(engine, reps, tokens)
    rows = library_costs(engine, 60)
    res = C.Result(7, "constrained_decode", "Grammar-constrained decoding: per-token cost",
                   C.command_line("constrained_decode.py", args.quick))
    mask_s = float(rows[0][3].split()[0]) * 1e-6  # llguidance's mask + consume per token, measured alone
    step_s = 1.0 / d["free_tps"] if d["free_tps"] else float("nan")
    res.tables.append(C.md_table(
        ["model", "decode tok/s unconstrained", "decode tok/s JSON Schema", "per-token time ratio (median of pairs)",
         "grammar work per token / decode step"],
        [[C.DEMO_LABEL, f"{d['free_tps']:.2f}", f"{d['json_tps']:.2f}", C.fmt_ratio(d["ratio"]),
          f"{mask_s * 1e6:.0f} µs / {step_s * 1e3:.0f} ms = {mask_s / step_s:.2%}"]]))
    res.tables.append(C.md_table(["library (demo tokenizer)", "tokenizer setup", "schema compile", "mask per token", "notes"],
                                 rows))
    res.notes.append(f"{reps} interleaved repetitions of {tokens} decoded tokens each (tokens decoded: "
                     f"{d['tokens']}), T=0.8, EOS biased -100 in both; the ratio is the median of each "
                     f"back-to-back pair's ({', '.join(f'{x:.2f}' for x in d['pairs'])}).")
    res.target("constrained / unconstrained per-token time", d["ratio"], 1.10)
    res.data = d
    C.finish(res, args, t0)


if __name__ == "__main__":
    main()
