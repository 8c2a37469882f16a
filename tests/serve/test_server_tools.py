"""Tools and structured output through the server, checked with the real `openai` client (issue 30).

The tiny Qwen2 with a Qwen-style tools template (tests/tiny_models.py: build_tool_model), so
mlx-lm's json_tools parser reads its calls. Random weights: only the grammar makes a call or a
JSON object come out, which is what these tests rely on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Literal

import openai
import pytest
from pydantic import BaseModel, Field

from engine.serve.reply import CallArguments, CallStart, ReplyReader, TextDelta
from engine.constraint import Constraint
from tests.engine_helpers import require_openblas
from tests.server_helpers import Server
from tests.tool_fixtures import CLOCK, WEATHER

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_time"}}


@pytest.fixture(scope="module")
def tool_server(tool_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(tool_model, tmp_path_factory.mktemp("tool-cache"))
    yield s
    s.close()


def ask(s: Server, messages: list[dict] = ASK, **kw: Any) -> Any:
    kw.setdefault("temperature", 1.0)
    kw.setdefault("seed", 0)
    kw.setdefault("max_tokens", 120)
    return s.client().chat.completions.create(model=s.model, messages=messages, **kw)


def test_required_tool_call_comes_back_as_openai_tool_calls(tool_server: Server) -> None:
    r = ask(tool_server, tools=[WEATHER, CLOCK], tool_choice="required", seed=1)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None and choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        args = json.loads(call.function.arguments)
        if call.function.name == "get_weather":
            assert args["city"] in ("Paris", "Rome", "Oslo") and 1 <= args["days"] <= 7
        else:
            assert call.function.name == "get_time" and len(args["zone"]) <= 6
    # The ids come from the tokens: the same request, the same ids.
    again = ask(tool_server, tools=[WEATHER, CLOCK], tool_choice="required", seed=1)
    assert [c.model_dump() for c in again.choices[0].message.tool_calls] == \
        [c.model_dump() for c in choice.message.tool_calls]


def test_streamed_tool_calls_are_assembled_by_the_client(tool_server: Server) -> None:
    kw = dict(tools=[WEATHER, CLOCK], tool_choice="required", seed=2, temperature=1.0, max_tokens=120)
    full = ask(tool_server, **kw)
    with tool_server.client().chat.completions.stream(model=tool_server.model, messages=ASK, **kw) as stream:
        final = stream.get_final_completion()
    got, want = final.choices[0], full.choices[0]
    assert got.finish_reason == "tool_calls"
    assert [(c.id, c.function.name, c.function.arguments) for c in got.message.tool_calls] == \
        [(c.id, c.function.name, c.function.arguments) for c in want.message.tool_calls]
    assert not got.message.content


def test_a_named_tool_choice_is_enforced(tool_server: Server) -> None:
    for seed in range(5):
        r = ask(tool_server, tools=[WEATHER, CLOCK], tool_choice=NAMED, parallel_tool_calls=False, seed=seed)
        calls = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls"
        assert len(calls) == 1 and calls[0].function.name == "get_time", calls
        assert set(json.loads(calls[0].function.arguments)) == {"zone"}


class Weather(BaseModel):
    city: Literal["Paris", "Rome", "Oslo"]
    temp: int = Field(ge=-20, le=45)
    sunny: bool
    note: str = Field(max_length=10)


def test_parse_returns_an_object_valid_against_the_schema_on_20_seeds(tool_server: Server) -> None:
    c = tool_server.client()
    for seed in range(20):
        r = c.chat.completions.parse(model=tool_server.model, messages=ASK, response_format=Weather,
                                     temperature=1.0, seed=seed, max_tokens=120)
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "stop", msg.content
        assert isinstance(msg.parsed, Weather), msg.content
        Weather.model_validate_json(msg.content)  # raises if not valid
        # Bounded whitespace: the JSON has fixed separators and no other blanks.
        assert msg.content == json.dumps(json.loads(msg.content), ensure_ascii=False)


def test_json_object_is_an_object(tool_server: Server) -> None:
    r = ask(tool_server, response_format={"type": "json_object"}, seed=5, max_tokens=200)
    text = r.choices[0].message.content
    assert text.startswith("{")
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


def agent_loop(s: Server, cache: bool = True) -> list[dict[str, Any]]:
    """user -> tool call -> tool result -> tool call -> tool result -> final answer: each step's
    response as the server sent it (`cache` False: every step a cold run)."""
    tools = [WEATHER, CLOCK]
    messages: list[dict[str, Any]] = list(ASK)
    out = []
    for step, choice in enumerate(["required", NAMED, "none"]):
        r = ask(s, messages, tools=tools, tool_choice=choice, parallel_tool_calls=False, seed=10 + step, max_tokens=80,
                logprobs=True, extra_body={"verbatim": {"mode": "exact", "cache": cache}})
        body = r.model_dump()
        out.append(body)
        msg = r.choices[0].message
        if msg.tool_calls:
            messages.append({"role": "assistant", "content": msg.content,
                             "tool_calls": [c.model_dump() for c in msg.tool_calls]})
            for c in msg.tool_calls:
                messages.append({"role": "tool", "tool_call_id": c.id,
                                 "content": json.dumps({"result": f"{c.function.name} ok", "step": step})})
    return out


def test_an_agent_loop_sent_twice_is_byte_identical_and_each_step_restores_the_previous(tool_server: Server) -> None:
    require_openblas()
    first, second = agent_loop(tool_server), agent_loop(tool_server)
    assert first[0]["choices"][0]["finish_reason"] == "tool_calls"
    assert first[1]["choices"][0]["finish_reason"] == "tool_calls"
    assert first[2]["choices"][0]["message"]["tool_calls"] is None
    for a, b in zip(first, second):
        assert json.dumps(a["choices"]) == json.dumps(b["choices"])  # content, tool calls, ids, finish
        assert a["verbatim"]["token_ids"] == b["verbatim"]["token_ids"]
    for k in (1, 2):  # the first pass: each step restores the previous steps' prompt
        prev, now = first[k - 1]["verbatim"], first[k]["verbatim"]
        assert now["restored"] >= prev["message_starts"][-1] > 0, (k, now["restored"], prev["message_starts"])
    for step in second:  # the second pass: every step a regenerate
        v = step["verbatim"]
        assert v["restored"] == v["prompt_tokens"] - 1 and v["identical_to_previous"] is True
    # Exact mode: every step equals a cold run, logprobs bit for bit (they are in the choices).
    for a, cold in zip(first, agent_loop(tool_server, cache=False)):
        assert cold["verbatim"]["restored"] == 0
        assert json.dumps(a["choices"]) == json.dumps(cold["choices"])


def refused(s: Server, **kw: Any) -> Any:
    jobs = len(s.recording.jobs)
    results = len(s.recording.results)
    with pytest.raises(openai.BadRequestError) as e:
        ask(s, **kw)
    assert len(s.recording.results) == results  # nothing was generated
    return e.value, len(s.recording.jobs) - jobs


def test_invalid_tool_input_is_refused_with_a_400_naming_the_field(tool_server: Server) -> None:
    s = tool_server
    err, jobs = refused(s, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "launch"}})
    assert err.body["param"] == "tool_choice" and "launch" in err.body["message"] and jobs == 0
    orphan = ASK + [{"role": "tool", "tool_call_id": "call_x", "content": "18"}]
    err, jobs = refused(s, messages=orphan, tools=[WEATHER])
    assert err.body["param"] == "messages[1].tool_call_id" and jobs == 0
    err, jobs = refused(s, response_format={"type": "json_schema", "json_schema": {
        "name": "x", "strict": True, "schema": {"type": "object", "properties": {"a": {"type": "string",
                                                                                      "pattern": "(?<=a)b"}}}}})
    assert err.body["param"] == "response_format" and jobs == 1  # refused by the engine before prefill
    err, jobs = refused(s, tool_choice="required")
    assert err.body["param"] == "tool_choice" and jobs == 0
    err, jobs = refused(s, tools=[{"type": "function", "function": {"name": "bad name!"}}])
    assert err.body["param"] == "tools[0].function.name"


def test_a_model_whose_template_has_no_tools_refuses_them(tiny_model: Path, tmp_path: Path) -> None:
    s = Server(tiny_model, None)
    try:
        err, jobs = refused(s, tools=[WEATHER])
        assert err.body["param"] == "tools" and "no tool calling" in err.body["message"]
    finally:
        s.close()


def test_reader_keeps_what_does_not_parse_as_content() -> None:
    """mlx-lm's json_tools parser on hand-written replies: a call to a tool not offered, or
    broken JSON, stays in the content as text."""
    def reader() -> ReplyReader:
        return ReplyReader("json_tools", Constraint.of([WEATHER], "auto"))

    good = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>'
    bad = '<tool_call>\n{"name": "launch", "arguments": {}}\n</tool_call>'

    r = reader().read("Let me check.\n" + good, "stop")
    assert r.content == "Let me check." and [(c.name, c.arguments) for c in r.calls] == [
        ("get_weather", '{"city": "Oslo", "days": 2}')]
    r = reader().read(bad, "stop")
    assert r.calls == [] and r.content == bad
    growing = reader()
    assert growing.feed("Hello <tool") == [TextDelta("Hello")]  # what may start a call (or precede one) is held
    events = [e for ch in good[5:] for e in growing.feed(ch)]  # the rest, a character at a time
    assert not [e for e in events if isinstance(e, TextDelta)]
    assert [e.name for e in events if isinstance(e, CallStart)] == ["get_weather"]
    assert "".join(e.fragment for e in events if isinstance(e, CallArguments)) == '{"city": "Oslo", "days": 2}'


def test_top_logprobs_under_a_grammar_list_only_allowed_tokens(tool_server: Server) -> None:
    """Where the grammar allows one token, the alternatives are that token alone (no -inf, which
    JSON cannot carry)."""
    r = ask(tool_server, tools=[WEATHER], tool_choice="required", logprobs=True, top_logprobs=5, seed=3)
    entries = r.choices[0].logprobs.content
    assert entries and all(t.logprob > float("-inf") for e in entries for t in e.top_logprobs)
    assert any(len(e.top_logprobs) == 1 for e in entries)  # forced stretches (the markup, the name)


def test_reader_returns_a_cut_call_as_a_call_and_never_its_markup_as_content() -> None:
    """Issue 36: a reply cut by max_tokens inside a call (free decoding under "auto" too)."""
    def read(text: str, finish: str = "length") -> Any:
        return ReplyReader("json_tools", Constraint.of([WEATHER], "auto")).read(text, finish)

    r = read('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"ci')
    assert r.content == "Let me check."
    assert [(c.name, c.arguments) for c in r.calls] == [("get_weather", '{"ci')]
    r = read('<tool_call>\n{"name": "get_wea')  # cut inside the name: no call, no markup
    assert r.content is None and r.calls == []
    whole = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n'
    r = read(whole)  # only the end marker cut: the whole call
    assert r.content is None and json.loads(r.calls[0].arguments) == {"city": "Oslo", "days": 2}
    # Ended by itself (EOS) inside a call before its name: left as text, as any call that does not parse.
    assert read('<tool_call>\n{"name": "get_wea', "stop").content == '<tool_call>\n{"name": "get_wea'


REPLIES = [  # (parser, reply text, engine finish)
    ("json_tools", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n'
                   '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 1}}\n'
                   '</tool_call>', "stop"),
    ("json_tools", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "O', "length"),
    ("json_tools", '<tool_call>\n{"name": "launch", "arguments": {}}\n</tool_call> and text', "stop"),
    ("json_tools", "Plain text, with a <tool and trailing space ", "stop"),
    ("pythonic", 'Sure. <|tool_call_start|>[get_weather(city="Oslo", days=2)]<|tool_call_end|>', "stop"),
]


@pytest.mark.parametrize("parser,text,finish", REPLIES)
def test_a_reply_read_token_by_token_gives_the_events_of_the_reply_read_whole(parser: str, text: str,
                                                                              finish: str) -> None:
    """Streamed and non-streamed answers agree: the reader decides on the text so far only, so any
    cut of the text into pieces gives the same events (joined) and the same reply; every argument
    fragment extends its call's arguments."""
    def read(step: int) -> tuple[list[Any], Any]:
        reader = ReplyReader(parser, Constraint.of([WEATHER], "auto"), "key")
        events = [e for i in range(0, len(text), step) for e in reader.feed(text[i:i + step])]
        last, reply = reader.finish(text, finish)
        return events + last, reply

    whole_events, whole = read(len(text))
    for step in (1, 2, 3, 5, 8):
        events, reply = read(step)
        assert reply == whole
        assert "".join(e.text for e in events if isinstance(e, TextDelta)) == (whole.content or "")
        for call in whole.calls:
            fragments = [e.fragment for e in events if isinstance(e, CallArguments)
                         and e.index == whole.calls.index(call)]
            assert "".join(fragments) == call.arguments
        assert [e for e in events if isinstance(e, CallStart)] == [e for e in whole_events if isinstance(e, CallStart)]
    if whole.calls:
        assert "<tool_call>" not in (whole.content or "") and "<|tool_call" not in (whole.content or "")
