"""Constrained decoding in the engine (issue 30): the grammar's mask before sampling under every
sampler setting, tools rendered by the model's own template, constrained replies that
regenerate instantly and identically and equal a cold run, receipts that record the constraint
(verified; tampered ones refused), and "identical to previous" keyed by the constraint.

A tiny random-weight Qwen2 with a Qwen-style tools template (tests/tiny_models.py:
build_tool_model): mlx-lm infers its json_tools format, as for real Qwen models. Random
weights at T=1 pick freely, so only the grammar keeps the output valid.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from engine import receipts
from engine.cli.main import main as cli
from engine.constraint import Constraint
from engine.engine import Engine
from engine.errors import EngineError, RequestError
from engine.generate.constraints import ConstraintFailed
from engine.receipts import ReceiptModel
from engine.types import GenerationRequest, SamplerSettings
from tests.engine_helpers import require_openblas
from tests.tool_fixtures import CLOCK, JSON_SCHEMA, SCHEMA, WEATHER, valid_weather

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def engine(tool_model: Path) -> Any:
    eng = Engine(use_disk=False, chunk=8)
    eng.load(str(tool_model))
    yield eng
    eng.close()


def generate(engine: Engine, constraint: Constraint, **sampler: Any) -> Any:
    sampler.setdefault("max_tokens", 160)
    try:
        return engine.generate(GenerationRequest(ASK, SamplerSettings(**sampler), constraint=constraint))
    except (EngineError, ConstraintFailed) as e:  # the sampler picked a token the grammar forbids
        pytest.fail(f"a sampled token broke the grammar: {e}")


SETTINGS = [
    {"temperature": 0.0},
    {"temperature": 1.0},
    {"temperature": 1.5, "top_k": 5},
    {"temperature": 1.0, "top_p": 0.5},
    {"temperature": 1.0, "min_p": 0.2},
    {"temperature": 1.0, "repetition_penalty": 1.3},
]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_the_mask_holds_under_every_sampler_setting(engine: Engine, settings: dict) -> None:
    c = Constraint.of(response_format=JSON_SCHEMA)
    for seed in range(3):
        r = generate(engine, c, seed=seed, **settings)
        assert r.finish_reason == "stop", (seed, r.text)
        obj = json.loads(r.text)
        assert valid_weather(obj), r.text
        # Bounded whitespace: fixed separators and nothing else.
        assert r.text == json.dumps(obj, ensure_ascii=False), r.text


def test_logit_bias_cannot_bring_back_a_forbidden_token(engine: Engine) -> None:
    """The mask comes first: +100 on a token the grammar never allows first still loses."""
    newline = engine.lm.tokenizer.encode("\n", add_special_tokens=False)[0]
    c = Constraint.of(response_format=JSON_SCHEMA)
    r = generate(engine, c, temperature=1.0, seed=4, logit_bias=((newline, 100.0),))
    assert r.tokens[0] != newline and r.text.startswith("{"), r.text
    assert valid_weather(json.loads(r.text))


def test_without_the_grammar_the_random_model_writes_no_json(engine: Engine) -> None:
    """The control: the same seeds unconstrained are not valid JSON, so the tests above can fail."""
    free = [engine.generate(GenerationRequest(ASK, SamplerSettings(temperature=1.0, seed=s, max_tokens=40)))
            for s in range(3)]
    for r in free:
        with pytest.raises(ValueError):
            json.loads(r.text)


def test_forced_tool_calls_name_an_offered_tool_with_valid_arguments(engine: Engine) -> None:
    tok = engine.lm.tokenizer
    start, end = tok.tool_call_start, tok.tool_call_end
    for seed in range(4):
        named = generate(engine, Constraint.of([WEATHER, CLOCK], {"type": "function", "function": {"name": "get_time"}},
                                                False), temperature=1.0, seed=seed)
        body = named.text.removeprefix(start + "\n").removesuffix("\n" + end)
        call = json.loads(body)
        assert named.text.count(start) == 1 and call["name"] == "get_time", named.text
        assert set(call["arguments"]) == {"zone"} and len(call["arguments"]["zone"]) <= 6
        any_tool = generate(engine, Constraint.of([WEATHER, CLOCK], "required"), temperature=1.0, seed=seed)
        blocks = [b for b in any_tool.text.split(start)[1:]]
        assert blocks and any_tool.text.startswith(start), any_tool.text
        for b in blocks:
            call = json.loads(b.strip().removesuffix(end).strip())
            assert call["name"] in ("get_weather", "get_time")


def test_tools_reach_the_template_and_tool_results_render(engine: Engine) -> None:
    with_tools = engine.prepare(GenerationRequest(ASK, constraint=Constraint.of([WEATHER], "auto")))
    text = engine.lm.tokenizer.decode(with_tools.prompt)
    assert "# Tools" in text and '"name": "get_weather"' in text
    history = ASK + [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 18}'},
    ]
    p = engine.prepare(GenerationRequest(history, constraint=Constraint.of([WEATHER], "auto")))
    text = engine.lm.tokenizer.decode(p.prompt)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 1}}\n</tool_call>' in text
    assert '<tool_response>\n{"temp": 18}\n</tool_response>' in text
    assert len(p.message_starts) >= 2  # the tools' system turn and the calls keep message cuts


def test_a_constrained_reply_regenerates_instantly_identically_and_equals_a_cold_run(tool_model: Path,
                                                                                    tmp_path: Path) -> None:
    require_openblas()
    eng = Engine(cache_dir=tmp_path / "cache", chunk=8)
    eng.load(str(tool_model))
    try:
        for c in (Constraint.of(response_format=JSON_SCHEMA), Constraint.of([WEATHER, CLOCK], "required")):
            req = GenerationRequest(ASK, SamplerSettings(temperature=1.0, seed=7, max_tokens=120), constraint=c)
            first = eng.generate(req)
            again = eng.generate(req)
            assert again.report.restored == again.report.prompt_tokens - 1
            assert again.tokens == first.tokens and again.logprobs == first.logprobs
            assert again.report.identical is True
            assert eng.verify(req, again).identical  # a cold run, no cache at all
        # Another constraint on the same prompt is another request: nothing to compare with.
        req = GenerationRequest(ASK, SamplerSettings(temperature=1.0, seed=7, max_tokens=120),
                                constraint=Constraint.of(response_format={"type": "json_object"}))
        assert eng.generate(req).report.identical is None
        assert eng.generate(req).report.identical is True
    finally:
        eng.close()


def test_a_constrained_receipt_verifies_and_a_tampered_one_is_refused(engine: Engine, tool_model: Path,
                                                                     tmp_path: Path, capsys: Any) -> None:
    req = GenerationRequest(ASK, SamplerSettings(temperature=1.0, seed=3, max_tokens=120),
                            constraint=Constraint.of(response_format=JSON_SCHEMA))
    result = engine.generate(req)
    receipt = receipts.build(req, result, ReceiptModel(str(tool_model), engine.info.key, "qwen-tools"), engine.chunk)

    def verify(doc: dict, name: str) -> tuple[int, str]:
        path = tmp_path / name
        path.write_text(json.dumps(doc))
        capsys.readouterr()
        code = cli(["verify", str(path), "--no-cache"])
        return code, capsys.readouterr().out

    doc = receipt.to_dict()
    assert doc["version"] == 2 and doc["constraint"]["response_format"]["schema"] == SCHEMA
    code, out = verify(doc, "good.json")
    assert code == 0 and out.startswith("OK"), out
    # The schema edited: the replay decodes under another grammar and parts from the receipt.
    edited = json.loads(json.dumps(doc))
    edited["constraint"]["response_format"]["schema"]["properties"]["temp"]["maximum"] = 3
    edited["constraint"]["response_format"]["schema"]["properties"]["city"]["maxLength"] = 2
    code, out = verify(edited, "schema.json")
    assert code == 1 and out.startswith("MISMATCH"), out
    # The constraint dropped (and the version with it): replayed free, it cannot match.
    dropped = {k: v for k, v in doc.items() if k != "constraint"}
    code, out = verify({**dropped, "version": 1}, "dropped.json")
    assert code == 1 and out.startswith("MISMATCH"), out
    # Version 2 without its constraint is not a receipt this engine replays.
    assert verify(dropped, "v2.json")[0] == 2


@pytest.mark.parametrize("constraint,param", [
    (lambda: Constraint.of(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "strict": True, "schema": {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=a)b"}}}}}),
     "response_format"),
])
def test_a_schema_the_library_cannot_compile_is_refused_naming_the_field(engine: Engine, constraint: Any,
                                                                        param: str) -> None:
    with pytest.raises(RequestError) as e:
        engine.prepare(GenerationRequest(ASK, constraint=constraint()))
    assert e.value.param == param


def test_a_template_without_tools_refuses_them(tiny_model: Path) -> None:
    eng = Engine(use_disk=False, chunk=8)
    eng.load(str(tiny_model))
    try:
        with pytest.raises(RequestError) as e:
            eng.prepare(GenerationRequest(ASK, constraint=Constraint.of([WEATHER], "auto")))
        assert e.value.param == "tools" and "no tool calling" in str(e.value)
    finally:
        eng.close()


def test_a_constraint_round_trips_through_its_request_fields_and_its_receipt_form() -> None:
    for c in (Constraint.of([WEATHER, CLOCK], {"type": "function", "function": {"name": "get_time"}}, False),
              Constraint.of([WEATHER], "required"), Constraint.of(response_format=JSON_SCHEMA),
              Constraint.of(response_format={"type": "json_object"})):
        f = c.request_fields()
        assert Constraint.of(f.get("tools"), f.get("tool_choice"), f.get("parallel_tool_calls"),
                             f.get("response_format")) == c
        assert Constraint.from_dict(json.loads(json.dumps(c.to_dict()))) == c


def test_cli_generate_takes_an_openai_request_file_and_its_receipt_verifies(tool_model: Path, tmp_path: Path,
                                                                           capsys: Any) -> None:
    """`generate --messages request.json` with tools and tool_choice: a forced call, and a
    receipt that records the constraint and replays."""
    req = tmp_path / "request.json"
    req.write_text(json.dumps({"messages": ASK, "tools": [WEATHER], "tool_choice": "required",
                               "parallel_tool_calls": False}))
    receipt = tmp_path / "r.json"
    assert cli(["generate", "--model", str(tool_model), "--messages", str(req), "--temperature", "1",
                "--seed", "5", "--max-tokens", "80", "--no-cache", "--json", "--receipt", str(receipt)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["text"].startswith("<tool_call>") and out["finish_reason"] == "stop"
    assert json.loads(receipt.read_text())["constraint"]["tool_choice"] == "required"
    assert cli(["verify", str(receipt), "--no-cache"]) == 0


def test_a_call_under_auto_and_a_response_format_is_receipted_and_replays(engine: Engine, tool_model: Path,
                                                                        tmp_path: Path, capsys: Any) -> None:
    """Issue 36: the composed constraint (tools, "auto", a response format) is what the receipt
    records, and `engine verify` rebuilds the same grammar from it: the call replays."""
    require_openblas()
    c = Constraint.of([WEATHER, CLOCK], "auto", False, JSON_SCHEMA)
    start = engine.lm.tokenizer.convert_tokens_to_ids("<tool_call>")
    req = GenerationRequest(ASK, SamplerSettings(temperature=1.0, seed=4, max_tokens=160, logit_bias=((start, 20.0),)),
                            constraint=c)
    result = engine.generate(req)
    assert result.text.startswith("<tool_call>") and result.finish_reason == "stop", result.text
    receipt = receipts.build(req, result, ReceiptModel(str(tool_model), engine.info.key, "qwen-tools"), engine.chunk)
    doc = receipt.to_dict()
    assert doc["constraint"]["tool_choice"] == "auto" and doc["constraint"]["response_format"]["schema"] == SCHEMA
    assert [t["function"]["name"] for t in doc["constraint"]["tools"]] == ["get_weather", "get_time"]
    path = tmp_path / "auto.json"
    path.write_text(json.dumps(doc))
    capsys.readouterr()
    assert cli(["verify", str(path), "--no-cache"]) == 0
    assert capsys.readouterr().out.startswith("OK")
    # Without the bias, the same composed grammar answers in the format: a cold run equals it.
    plain = dataclasses.replace(req, sampler=SamplerSettings(temperature=1.0, seed=4, max_tokens=160))
    answer = engine.generate(plain)
    assert valid_weather(json.loads(answer.text)), answer.text
    assert engine.verify(plain, answer).identical


def test_grammars_are_cached_per_namespace_and_within_a_byte_budget(engine: Engine) -> None:
    from engine.generate import constraints

    g = constraints.Grammars(engine.lm.tokenizer, engine.builder.grammars.width, engine.lm.eos_ids)
    c = Constraint.of(response_format=JSON_SCHEMA)
    g.grammar(c, "alice")
    g.grammar(c, "alice")
    assert g.compiles == 1
    g.grammar(c, "bob")
    assert g.compiles == 2  # another namespace compiles its own
    big = {"type": "object", "properties": {"a": {"type": "integer", "description": "x" * 900_000}}}
    for i in range(30):
        g.grammar(Constraint.of(response_format={"type": "json_schema", "json_schema": {
            "name": "big", "schema": {**big, "title": str(i)}}}), "alice")
    assert g._bytes <= constraints._COMPILED_BYTES and g._bytes == sum(len(v) for v in g._compiled.values())


def test_the_previous_reply_keys_hold_a_digest_of_the_constraint(engine: Engine) -> None:
    big = {"type": "object", "properties": {"a": {"type": "integer", "description": "y" * 100_000}}}
    c = Constraint.of(response_format={"type": "json_schema", "json_schema": {"name": "big", "schema": big}})
    engine.generate(GenerationRequest(ASK, SamplerSettings(max_tokens=2), constraint=c))
    key = next(reversed(engine._previous))
    assert c.digest() in key and all(len(str(part)) < 50_000 for part in key)


TREE = {"type": "object", "properties": {"label": {"type": "string", "maxLength": 4},
                                         "children": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}},
        "required": ["label"], "additionalProperties": False}


def test_only_schemas_that_must_contain_themselves_are_unsatisfiable() -> None:
    from engine.generate.constraints import no_finite_value

    assert no_finite_value({"$ref": "#"})
    assert no_finite_value({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})
    assert no_finite_value({"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]})
    assert no_finite_value({"type": "array", "items": {"$ref": "#"}, "minItems": 1})
    assert no_finite_value({"anyOf": [{"$ref": "#"}, {"allOf": [{"$ref": "#"}]}]})
    # Recursion with a way out: an optional property, an empty array, a null branch.
    assert not no_finite_value(TREE)
    assert not no_finite_value({"type": "object", "properties": {"x": {"$ref": "#"}}})
    assert not no_finite_value({"anyOf": [{"type": "null"}, {"type": "array", "items": {"$ref": "#"}, "minItems": 1}]})
    assert not no_finite_value({"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"})


def test_a_recursive_schema_with_a_way_out_is_accepted_and_decoded(engine: Engine) -> None:
    c = Constraint.of(response_format={"type": "json_schema", "json_schema": {"name": "tree", "schema": TREE}})
    r = generate(engine, c, temperature=1.0, seed=2, max_tokens=200)

    def valid(node: Any) -> bool:
        return (isinstance(node, dict) and set(node) <= {"label", "children"} and isinstance(node.get("label"), str)
                and len(node["label"]) <= 4 and all(valid(n) for n in node.get("children", [])))

    if r.finish_reason == "stop":
        assert valid(json.loads(r.text)), r.text
    else:
        assert r.text.startswith('{"label": "')


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_a_composed_constraint_tools_and_a_format_is_in_the_receipt_and_replays(engine: Engine, tool_model: Path,
                                                                               tmp_path: Path, capsys: Any,
                                                                               choice: str) -> None:
    """Tools and a response format together (issue 36): the receipt records the composed
    constraint, `engine verify` replays it cold, and a receipt with the tools taken out does not."""
    constraint = Constraint.of([WEATHER, CLOCK], choice, None, JSON_SCHEMA)
    req = GenerationRequest(ASK, SamplerSettings(temperature=1.0, seed=5, max_tokens=120), constraint=constraint)
    result = engine.generate(req)
    doc = receipts.build(req, result, ReceiptModel(str(tool_model), engine.info.key, "qwen-tools"),
                         engine.chunk).to_dict()
    assert Constraint.from_dict(doc["constraint"]) == constraint
    assert doc["constraint"]["response_format"]["schema"] == SCHEMA and len(doc["constraint"]["tools"]) == 2

    def verify(d: dict, name: str) -> tuple[int, str]:
        path = tmp_path / name
        path.write_text(json.dumps(d))
        capsys.readouterr()
        code = cli(["verify", str(path), "--no-cache"])
        return code, capsys.readouterr().out

    code, out = verify(doc, "composed.json")
    assert code == 0 and out.startswith("OK"), out
    if choice == "required":  # the reply is a call: without the tools the replay cannot make it
        alone = {**doc, "constraint": {k: v for k, v in doc["constraint"].items()
                                       if k not in ("tools", "tool_choice", "parallel_tool_calls")}}
        code, out = verify(alone, "format-only.json")
        assert code == 1 and out.startswith("MISMATCH"), out


def test_a_constrained_reply_continued_equals_the_unstopped_one(tool_model: Path) -> None:
    """Continue under a grammar: the guide reads the reply so far first, so the masks of the
    next steps (and the tokens, and the logprobs) are the unstopped run's."""
    import dataclasses

    from engine.types import Continuation

    c = Constraint.of(response_format=JSON_SCHEMA)
    req = GenerationRequest(ASK, SamplerSettings(temperature=1.0, seed=7, max_tokens=120), constraint=c)
    eng = Engine(use_disk=False, chunk=8)
    eng.load(str(tool_model))
    try:
        full = eng.generate(req)
        assert len(full.tokens) > 8
        part = eng.generate(dataclasses.replace(req, sampler=dataclasses.replace(req.sampler, max_tokens=6)))
        cont = eng.generate(dataclasses.replace(req, continuation=Continuation(tuple(part.tokens))))
        assert part.tokens + cont.tokens == full.tokens and part.logprobs + cont.logprobs == full.logprobs
        assert cont.report.restored == cont.report.prompt_tokens + 5 and cont.report.prefill_tokens == 1
        assert valid_weather(json.loads(part.text[: cont.report.continued_chars] + cont.text))
    finally:
        eng.close()


def test_a_continue_whose_reply_so_far_does_not_fit_the_schema_says_so(tool_model: Path) -> None:
    """A reply made without the schema, continued under it: refused before any prefill, saying
    the reply so far is not valid under it (not that a simpler schema avoids it)."""
    from engine.types import Continuation

    eng = Engine(use_disk=False, chunk=8)
    eng.load(str(tool_model))
    try:
        req = GenerationRequest(ASK, SamplerSettings(temperature=0.0, max_tokens=40),
                                constraint=Constraint.of(response_format=JSON_SCHEMA),
                                continuation=Continuation(text="Hello, it is sunny"))
        with pytest.raises(ConstraintFailed) as e:
            eng.generate(req)
        assert "the reply so far is not valid under this 'response_format'" in str(e.value)
        assert "simpler schema" not in str(e.value) and e.value.param == "continue"
    finally:
        eng.close()
