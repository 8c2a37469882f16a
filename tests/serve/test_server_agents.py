"""Tools and formats together as OpenAI defines them, through the server (issue 36, items 1-7).

The tiny random-weight Qwen2 with a tools template (tests/tiny_models.py: build_tool_model) and
the real `openai` client. Random weights pick freely, so only the grammar shapes a reply: a
valid argument, a call under auto + response_format, exactly one call, all come from it.
Two API keys, so the grammar cache can be seen per namespace.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
from pathlib import Path
from typing import Any, Iterator

import openai
import pytest
from pydantic import BaseModel, Field

from tests.server_helpers import Server
from tests.tool_fixtures import CLOCK, SCHEMA, WEATHER, valid_weather

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
FORMAT = {"type": "json_schema", "json_schema": {"name": "weather", "strict": True, "schema": SCHEMA}}
# A tool whose parameters refer to themselves: `copy` is whatever `name` is (a string).
COPY = {"type": "function", "function": {"name": "rename", "parameters": {
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 5},
                                     "copy": {"$ref": "#/properties/name"}},
    "required": ["name", "copy"], "additionalProperties": False}}}


class City(BaseModel):
    name: str = Field(max_length=6)
    days: int = Field(ge=1, le=3)


class Trip(BaseModel):
    """Nested: pydantic writes `City` under `$defs` and refers to it with `#/$defs/City`."""
    origin: City
    stops: list[City] = Field(max_length=2)


@pytest.fixture(scope="module")
def server(tool_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(tool_model, tmp_path_factory.mktemp("agents-cache"), api_keys=["alice-key", "bob-key"])
    yield s
    s.close()


def client(s: Server, key: str = "alice-key") -> openai.OpenAI:
    return s.client(api_key=key)


def ask(s: Server, messages: list[dict] = ASK, key: str = "alice-key", **kw: Any) -> Any:
    kw.setdefault("temperature", 1.0)
    kw.setdefault("seed", 0)
    kw.setdefault("max_tokens", 120)
    return client(s, key).chat.completions.create(model=s.model, messages=messages, **kw)


def named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


# -- item 1: $ref resolves against the tool's own parameters ------------------------------------


def test_a_ref_in_a_forced_tools_parameters_resolves_against_that_schema(server: Server) -> None:
    for seed in range(6):
        for choice in ("required", named("rename")):
            r = ask(server, tools=[COPY], tool_choice=choice, seed=seed)
            assert r.choices[0].finish_reason == "tool_calls", r.choices[0]
            for call in r.choices[0].message.tool_calls:
                args = json.loads(call.function.arguments)
                # Valid against the tool's own schema: `copy` is a string of at most 5 characters
                # (against the wrapper it would be the wrapper's `name`: the const "rename", or worse).
                assert set(args) == {"name", "copy"}, args
                assert all(isinstance(v, str) and len(v) <= 5 for v in args.values()), args


def test_pydantic_function_tool_on_a_nested_model_forced_gives_valid_arguments(server: Server) -> None:
    tool = openai.pydantic_function_tool(Trip, name="plan_trip")
    assert "$defs" in tool["function"]["parameters"]  # what the wrapper once broke
    for seed in range(4):
        r = ask(server, tools=[tool], tool_choice=named("plan_trip"), seed=seed, max_tokens=160)
        assert r.choices[0].finish_reason == "tool_calls", r.choices[0]
        (call,) = r.choices[0].message.tool_calls
        Trip.model_validate_json(call.function.arguments)  # raises if not valid


# -- items 2 and 3: tools and a response format together ------------------------------------------


def test_auto_with_a_response_format_allows_a_call_or_content_in_the_format(server: Server) -> None:
    """Random weights rarely pick the call's first token, so half the seeds favour it with a
    logit_bias: the grammar must allow it (before, it allowed JSON content only)."""
    start = server.engine(lambda e: e.lm.tokenizer.convert_tokens_to_ids("<tool_call>"))
    calls, answers = 0, 0
    for seed in range(12):
        bias = {str(start): 20} if seed % 2 else None
        r = ask(server, tools=[WEATHER, CLOCK], tool_choice="auto", response_format=FORMAT, seed=seed,
                logit_bias=bias, parallel_tool_calls=False, max_tokens=200)
        choice = r.choices[0]
        if choice.message.tool_calls:
            calls += 1
            assert choice.finish_reason == "tool_calls" and choice.message.content is None
            for c in choice.message.tool_calls:
                assert c.function.name in ("get_weather", "get_time"), c
                json.loads(c.function.arguments)
        else:
            answers += 1
            assert choice.finish_reason == "stop", choice
            assert valid_weather(json.loads(choice.message.content)), choice.message.content
    assert calls > 0 and answers > 0, (calls, answers)


def test_a_forced_choice_with_a_response_format_is_the_call_and_the_format_shapes_the_next_turn(server: Server) -> None:
    messages: list[dict[str, Any]] = list(ASK)
    r = ask(server, messages, tools=[WEATHER], tool_choice="required", response_format=FORMAT, seed=3)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None and choice.message.tool_calls
    messages += [{"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in choice.message.tool_calls]}]
    messages += [{"role": "tool", "tool_call_id": c.id, "content": '{"temp": 18}'} for c in choice.message.tool_calls]
    r = ask(server, messages, tools=[WEATHER], tool_choice="none", response_format=FORMAT, seed=3)
    assert r.choices[0].finish_reason == "stop"
    assert valid_weather(json.loads(r.choices[0].message.content))


def test_auto_with_a_response_format_regenerates_identically_and_equals_a_cold_run(server: Server) -> None:
    from tests.engine_helpers import require_openblas

    require_openblas()
    kw = dict(tools=[WEATHER, CLOCK], tool_choice="auto", response_format=FORMAT, seed=21, logprobs=True)
    first = ask(server, **kw).model_dump()
    again = ask(server, **kw).model_dump()
    cold = ask(server, **kw, extra_body={"verbatim": {"cache": False}}).model_dump()
    assert json.dumps(again["choices"]) == json.dumps(first["choices"])
    v = again["verbatim"]
    assert v["restored"] == v["prompt_tokens"] - 1 and v["identical_to_previous"] is True
    assert cold["verbatim"]["restored"] == 0 and json.dumps(cold["choices"]) == json.dumps(first["choices"])


# -- item 4: a named choice is exactly one call; parallel calls otherwise ---------------------------


def test_a_named_choice_is_exactly_one_call_even_with_parallel_calls_allowed(server: Server) -> None:
    for seed in range(8):
        r = ask(server, tools=[WEATHER, CLOCK], tool_choice=named("get_time"), parallel_tool_calls=True, seed=seed,
                max_tokens=200)
        calls = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls", r.choices[0]
        assert len(calls) == 1 and calls[0].function.name == "get_time", calls


def test_required_allows_parallel_calls_unless_parallel_tool_calls_is_false(server: Server) -> None:
    counts = [len(ask(server, tools=[WEATHER, CLOCK], tool_choice="required", seed=s, max_tokens=200)
                  .choices[0].message.tool_calls or []) for s in range(8)]
    assert max(counts) > 1, counts
    for s in range(4):
        r = ask(server, tools=[WEATHER, CLOCK], tool_choice="required", parallel_tool_calls=False, seed=s)
        assert len(r.choices[0].message.tool_calls) == 1


# -- item 5: a call cut by max_tokens ----------------------------------------------------------------


def test_a_cut_call_is_a_tool_call_with_partial_arguments_and_finish_length(server: Server) -> None:
    r = ask(server, tools=[WEATHER], tool_choice="required", seed=1, max_tokens=22)
    choice = r.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.content is None  # never the markup
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    assert call.function.arguments.startswith("{") and "</tool_call>" not in call.function.arguments
    # Streamed: no markup in any content delta, the same call, and no content at the end.
    deltas: list[Any] = []
    for chunk in client(server).chat.completions.create(model=server.model, messages=ASK, tools=[WEATHER],
                                                        tool_choice="required", seed=1, max_tokens=22,
                                                        temperature=1.0, stream=True):
        if chunk.choices:
            deltas.append(chunk.choices[0])
    assert all(not d.delta.content for d in deltas)
    assert deltas[-1].finish_reason == "length"
    streamed = [tc for d in deltas for tc in d.delta.tool_calls or []]
    # One call, named once, its arguments in fragments as they were decoded (issue 47).
    assert [tc.function.name for tc in streamed if tc.function.name] == ["get_weather"]
    assert {tc.index for tc in streamed} == {0} and len(streamed) > 1
    assert "".join(tc.function.arguments or "" for tc in streamed) == call.function.arguments


def test_a_cut_call_sent_back_as_it_came_is_accepted_in_the_history(server: Server) -> None:
    """The Agents SDK sends a cut call back with its partial arguments (and a tool message saying
    the tool failed): the server must take back what it gave, as OpenAI does, not 400 on it."""
    cut = ask(server, tools=[WEATHER], tool_choice="required", seed=1, max_tokens=22).choices[0].message
    (call,) = cut.tool_calls
    with pytest.raises(ValueError):
        json.loads(call.function.arguments)  # a JSON prefix, not JSON
    history = [*ASK, cut.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "An error occurred while running the tool."}]
    r = ask(server, history, tools=[WEATHER], seed=1, max_tokens=8)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # Its prompt holds the partial arguments as written (the template writes a string as JSON), once.
    prompt = server.recording.results[-1].prompt_ids
    text = server.engine(lambda e: e.lm.tokenizer.decode(prompt))
    assert text.count(json.dumps(call.function.arguments)) == 1, text


def test_a_tool_call_stream_ends_without_an_empty_content_delta(server: Server) -> None:
    kw = dict(tools=[WEATHER], tool_choice="required", seed=2, temperature=1.0, max_tokens=120)
    with client(server).chat.completions.stream(model=server.model, messages=ASK, **kw) as stream:
        chunks = [e.chunk for e in stream if e.type == "chunk"]
        final = stream.get_final_completion()
    assert final.choices[0].message.content is None and final.choices[0].message.tool_calls
    assert all("content" not in (c.choices[0].delta.model_dump(exclude_unset=True)) for c in chunks if c.choices)


# -- item 6: hostile schemas ---------------------------------------------------------------------


def refused(s: Server, **kw: Any) -> dict[str, Any]:
    results = len(s.recording.results)
    with pytest.raises(openai.BadRequestError) as e:
        ask(s, **kw)
    assert len(s.recording.results) == results  # nothing was generated: found before any prefill
    body = e.value.body
    assert len(body["message"]) <= 200 and "<state>" not in body["message"] and "%json" not in body["message"]
    return body


def fmt(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


HOSTILE = {
    "self": {"$ref": "#"},
    "cycle": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    "required recursion": {"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]},
    "counted repeat": {"type": "object", "properties": {"x": {"type": "string", "pattern": "^(x{1000}){1000}$"}},
                       "required": ["x"]},
    "600 optional keys": {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(600)},
                          "additionalProperties": False},
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_schema_is_refused_before_prefill_with_a_short_400(server: Server, name: str) -> None:
    body = refused(server, response_format=fmt(HOSTILE[name]))
    assert body["param"] == "response_format", body
    # Streamed too: a 400 status before the stream starts, not an error inside a 200 stream.
    with pytest.raises(openai.BadRequestError) as e:
        client(server).chat.completions.create(model=server.model, messages=ASK, response_format=fmt(HOSTILE[name]),
                                               stream=True)
    assert e.value.body["param"] == "response_format"
    tool = {"type": "function", "function": {"name": "bad", "parameters": {"type": "object", **{
        k: v for k, v in HOSTILE[name].items() if k != "type"}}}}
    if name != "self":  # {"$ref": "#"} of an object: the same refusal, naming the tool
        body = refused(server, tools=[WEATHER, tool], tool_choice="required")
        assert body["param"] == "tools[1]", body


# A grammar that passes every check before prefill and fails later: a long fixed-length string
# first (the probe never walks past it), then an object past llguidance's row limit.
LATE = {"type": "object", "properties": {
    "pad": {"type": "string", "minLength": 120, "maxLength": 120},
    "big": {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(600)},
            "additionalProperties": False}}, "required": ["pad", "big"], "additionalProperties": False}


def test_a_grammar_failing_while_decoding_ends_the_reply_with_a_400_and_the_server_goes_on(server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as e:  # not 503: the client does not retry
        ask(server, response_format=fmt(LATE), max_tokens=400, temperature=0.0)
    body = e.value.body
    assert body["code"] == "constraint_failed" and body["param"] == "response_format", body
    assert len(body["message"]) <= 200 and "<state>" not in body["message"]
    # Streamed: a final error event inside the 200 stream, no [DONE].
    with pytest.raises(openai.APIError) as e:
        for _ in client(server).chat.completions.create(model=server.model, messages=ASK, response_format=fmt(LATE),
                                                        max_tokens=400, temperature=0.0, stream=True):
            pass
    assert "constraint" in str(e.value) or "grammar" in str(e.value)
    # The engine is still in service.
    r = ask(server, response_format=FORMAT, seed=4)
    assert valid_weather(json.loads(r.choices[0].message.content))


# -- item 7: isolation and bounds ----------------------------------------------------------------


def compiles(s: Server) -> int:
    return s.engine(lambda e: e.builder.grammars.compiles)


def test_compiled_grammars_are_cached_per_api_key(server: Server) -> None:
    schema = fmt({"type": "object", "properties": {"guess": {"type": "integer"}}, "required": ["guess"]})
    n = compiles(server)
    ask(server, response_format=schema, key="alice-key", max_tokens=4)
    assert compiles(server) == n + 1
    ask(server, response_format=schema, key="alice-key", max_tokens=4, seed=1)
    assert compiles(server) == n + 1  # the same key: cached
    ask(server, response_format=schema, key="bob-key", max_tokens=4)
    assert compiles(server) == n + 2  # another key: compiled again, whatever alice sent


def test_a_schema_or_tool_list_past_1_mib_is_refused_naming_the_field(server: Server) -> None:
    big = {"type": "object", "properties": {"a": {"type": "string", "description": "x" * (1 << 20)}}}
    assert refused(server, response_format=fmt(big))["param"] == "response_format"
    tool = {"type": "function", "function": {"name": "big", "parameters": big}}
    assert refused(server, tools=[tool])["param"] == "tools"


def rss() -> int:
    """This process's resident bytes, after glibc hands freed heap back (malloc_trim): what is
    held, not the allocator's slack from the bodies just parsed (client and server share the
    process here)."""
    gc.collect()  # exceptions caught above hold their frames in cycles
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads RSS from /proc")
def test_rss_stays_bounded_after_40_distinct_large_schemas(server: Server) -> None:
    """40 distinct 6 MB schemas (refused: past 1 MiB) and 40 distinct ~0.9 MB ones (compiled,
    answered): the server (this process) grows by at most ~150 MB, not by the schemas kept."""
    def schema(i: int, size: int) -> dict[str, Any]:
        return fmt({"type": "object", "properties": {"a": {"type": "integer", "description": f"{i}" + "x" * size}},
                    "required": ["a"]})

    for i in range(2):  # warm: the first compiles, allocator pools
        ask(server, response_format=schema(-i - 1, 900_000), max_tokens=2)
    before = rss()
    for i in range(40):
        assert refused(server, response_format=schema(i, 6_000_000))["param"] == "response_format"
        server.recording.jobs.clear()  # the test's recording holds each job's request: not the server's memory
    mid = rss()
    for i in range(40):
        ask(server, response_format=schema(i, 900_000), max_tokens=2)
        server.recording.jobs.clear()
    grown = rss() - before
    print(f"RSS grew by {(mid - before) / 2**20:.1f} MB after 40 refused, {grown / 2**20:.1f} MB after 40 more compiled")
    assert grown < 150 << 20, f"RSS grew by {grown >> 20} MB"
