"""The conformance suite: the client libraries people point at a local server, run as their
quickstarts say, against Verbatim's server on the tiny tool model (issue 36).

openai, the OpenAI Agents SDK, pydantic-ai, langchain-openai and litellm run in this process (the
test extra pins them); instructor needs an older openai (its `jiter<0.15`), so it runs in an
environment of its own (.venv-instructor, scripts/client_envs.sh) as a subprocess. Every library
talks to the server through a recording proxy (tests/recording_proxy.py), so one set of checks
sees the bytes each library got, whatever HTTP stack it uses:

- every tool call in every reply has arguments valid against that tool's own parameter schema
  (jsonschema), and every reply under a JSON Schema `response_format` validates against it;
- the library's own result validates (its tool ran with valid arguments; its structured output
  parsed into the pydantic model);
- the same run twice sends the same requests and gets byte-identical replies (all but the id and
  the clock), every step of the second run a regenerate: cached_tokens = prompt_tokens - 1, the
  same token ids and bit-equal logprobs.

A random-weight model has no wish to call a tool, so a tool call is asked for as each library
lets a user ask for one (tool_choice "required" on the first step); what the model then writes is
left to it, inside the grammar.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator, Literal

import jsonschema
import pytest
from pydantic import BaseModel, ConfigDict, Field

from tests.engine_helpers import require_openblas
from tests.recording_proxy import Exchange, RecordingProxy
from tests.server_helpers import Server

# litellm fetches a price list from GitHub at import unless told to use its bundled copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

ROOT = Path(__file__).resolve().parents[2]
INSTRUCTOR_PYTHON = ROOT / ".venv-instructor" / "bin" / "python"
ASK = "What is the weather in Paris?"
SEED = 3
MAX_TOKENS = 96

City = Literal["Paris", "Rome", "Oslo"]


class WeatherArgs(BaseModel):
    """get_weather's parameters."""
    model_config = ConfigDict(extra="forbid")
    city: City
    days: Annotated[int, Field(ge=1, le=7)]


class Report(BaseModel):
    """A weather report."""
    model_config = ConfigDict(extra="forbid")
    city: City
    sunny: bool


@dataclass
class Tools:
    """The tool functions' side: each call the library made, checked by pydantic as it came."""
    calls: list[WeatherArgs] = field(default_factory=list)

    def get_weather(self, city: str, days: int) -> str:
        self.calls.append(WeatherArgs(city=city, days=days))  # raises if not valid
        return json.dumps({"city": city, "days": days, "sunny": True})


@pytest.fixture(scope="module")
def server(tool_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    require_openblas()
    s = Server(tool_model, tmp_path_factory.mktemp("clients-cache"))
    yield s
    s.close()


@pytest.fixture(scope="module")
def proxy(server: Server) -> Iterator[RecordingProxy]:
    p = RecordingProxy(server.url)
    yield p
    p.close()


# -- what every library got, checked from the bytes -----------------------------------------------


@dataclass
class Reply:
    """One exchange's reply, assembled (streamed or not)."""
    finish: str
    content: str | None
    calls: list[tuple[str, str]]  # (name, arguments)
    usage: dict[str, Any] | None


def assemble(x: Exchange) -> Reply:
    path = x.path.split("?")[0]
    if path.endswith("/responses"):
        return assemble_response(x)
    if path.endswith("/messages"):
        return assemble_message(x)
    events = x.events()
    if events and events[0].get("object") == "chat.completion":
        choice = events[0]["choices"][0]
        msg = choice["message"]
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls") or ()]
        return Reply(choice["finish_reason"], msg.get("content"), calls, events[0].get("usage"))
    content: list[str] = []
    calls_by_index: dict[int, list[str]] = {}
    finish, usage = "", None
    for e in events:
        usage = e.get("usage") or usage
        for choice in e.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content") is not None:
                content.append(delta["content"])
            for c in delta.get("tool_calls") or ():
                slot = calls_by_index.setdefault(c["index"], ["", ""])
                slot[0] += (c.get("function") or {}).get("name") or ""
                slot[1] += (c.get("function") or {}).get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    return Reply(finish, "".join(content) if content else None,
                 [(n, a) for _, (n, a) in sorted(calls_by_index.items())], usage)


def _chat_usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    """A wire format's usage as chat completions writes it (what run_twice compares)."""
    return {"prompt_tokens": prompt, "completion_tokens": completion, "prompt_tokens_details": {"cached_tokens": cached}}


def assemble_response(x: Exchange) -> Reply:
    """A Responses reply (whole, or its stream's last event), its output items read back."""
    events = x.events()
    final = events[0] if events[0].get("object") == "response" else events[-1]["response"]
    if len(events) > 1:  # streamed: every argument delta is a prefix of its call's final arguments
        args: dict[str, str] = {}
        for e in events:
            if e.get("type") == "response.function_call_arguments.delta":
                args[e["item_id"]] = args.get(e["item_id"], "") + e["delta"]
            if e.get("type") == "response.function_call_arguments.done":
                assert args.get(e["item_id"], "") == e["arguments"], (args, e)
    out = final["output"]
    text = "".join(p["text"] for o in out if o["type"] == "message" for p in o["content"])
    calls = [(o["name"], o["arguments"]) for o in out if o["type"] == "function_call"]
    finish = "length" if final["status"] == "incomplete" else ("tool_calls" if calls else "stop")
    u = final["usage"]
    usage = _chat_usage(u["input_tokens"], u["output_tokens"], u["input_tokens_details"]["cached_tokens"])
    return Reply(finish, text if any(o["type"] == "message" for o in out) else None, calls, usage)


def assemble_message(x: Exchange) -> Reply:
    """An Anthropic reply (whole, or its stream assembled), its usage split checked."""
    events = x.events()
    if events[0].get("type") == "message":
        msg = events[0]
        blocks = msg["content"]
        texts = [b["text"] for b in blocks if b["type"] == "text"]
        calls = [(b["name"], json.dumps(b["input"])) for b in blocks if b["type"] == "tool_use"]
        stop, u = msg["stop_reason"], msg["usage"]
    else:
        texts, calls, parts = [], [], {}
        stop, u = "", {}
        for e in events:
            if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use":
                parts[e["index"]] = (e["content_block"]["name"], "")
            elif e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta":
                name, so_far = parts[e["index"]]
                parts[e["index"]] = (name, so_far + e["delta"]["partial_json"])
            elif e["type"] == "content_block_delta":
                texts.append(e["delta"]["text"])
            elif e["type"] == "message_delta":
                stop, u = e["delta"]["stop_reason"], e["usage"]
        calls = [parts[i] for i in sorted(parts)]
    prompt = u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
    finish = {"tool_use": "tool_calls", "max_tokens": "length"}.get(stop, "stop")
    return Reply(finish, "".join(texts) if texts else None, calls,
                 _chat_usage(prompt, u["output_tokens"], u["cache_read_input_tokens"]))


def check_reply(x: Exchange) -> Reply:
    """The reply obeys the request: tool calls valid against their tools' schemas, content in the
    response format; no tool markup in content; nothing cut but free text (a random-weight model
    writes prose until max_tokens)."""
    assert x.status == 200, (x.status, x.response[:300])
    req, reply = x.request_json(), assemble(x)
    fmt = req.get("response_format") or (req.get("text") or {}).get("format") or {}
    if fmt.get("type") == "json_schema" and "json_schema" not in fmt:  # Responses' flat text.format
        fmt = {"type": "json_schema", "json_schema": fmt}
    cut = reply.finish == "length"
    # Cut by max_tokens: free text, or calls of which the last is cut (its arguments a JSON
    # prefix, as OpenAI returns them); never cut content under a response format.
    assert reply.finish in ("stop", "tool_calls") or (cut and (reply.calls or not fmt)), reply
    if reply.content is not None:
        assert "<tool_call>" not in reply.content and "</tool_call>" not in reply.content, reply.content
    # chat's {"function": {...}}, Responses' flat tools, Anthropic's input_schema
    schemas = {t.get("function", t)["name"]: t.get("function", t).get("parameters") or t.get("input_schema") or {}
               for t in req.get("tools") or ()}
    for name, arguments in reply.calls[:-1] if cut else reply.calls:
        assert name in schemas, (name, list(schemas))
        jsonschema.validate(json.loads(arguments), schemas[name])
    if reply.finish == "tool_calls":
        assert reply.calls and not reply.content, reply
    if reply.finish == "stop" and fmt.get("type") == "json_schema":
        jsonschema.validate(json.loads(reply.content or ""), fmt["json_schema"]["schema"])
    return reply


@dataclass
class Twice:
    first: list[Reply]
    second: list[Reply]
    outputs: tuple[Any, Any]


def run_twice(server: Server, proxy: RecordingProxy, run: Callable[[], Any], path: str = "/chat/completions") -> Twice:
    """Run a library's quickstart twice: the same requests, byte-identical replies, every step of
    the second run restored up to its last prompt token, tokens and logprobs equal (`path`: the
    wire format's generating route)."""
    mark, results = proxy.mark(), len(server.recording.results)
    out_a = run()
    mid, mid_results = proxy.mark(), len(server.recording.results)
    out_b = run()
    both, b = proxy.since(mark, path), proxy.since(mid, path)
    a = both[: len(both) - len(b)]
    gen_a, gen_b = server.recording.results[results:mid_results], server.recording.results[mid_results:]
    assert a and len(a) == len(b) == len(gen_a) == len(gen_b), (len(a), len(b), len(gen_a), len(gen_b))
    for x, y in zip(a, b):
        assert x.request == y.request  # the library sent the same bytes again
        assert x.stable() == y.stable(), (x.response[:400], y.response[:400])  # byte-identical reply
        ux, uy = assemble(x).usage, assemble(y).usage
        if ux or uy:
            assert (ux["prompt_tokens"], ux["completion_tokens"]) == (uy["prompt_tokens"], uy["completion_tokens"])
    for g, h in zip(gen_a, gen_b):
        assert h.tokens == g.tokens and h.logprobs == g.logprobs  # bit-equal
        assert h.report.restored == len(h.prompt_ids) - 1, (h.report.restored, len(h.prompt_ids))
    replies_b = [check_reply(y) for y in b]
    for y in replies_b:  # what the library saw of it, where it asked for usage
        if y.usage:
            assert y.usage["prompt_tokens_details"]["cached_tokens"] == y.usage["prompt_tokens"] - 1, y.usage
    return Twice([check_reply(x) for x in a], replies_b, (out_a, out_b))


def tool_calls(replies: list[Reply]) -> list[tuple[str, str]]:
    return [c for r in replies for c in r.calls]


# -- openai ---------------------------------------------------------------------------------------


def test_openai_tools_streamed_tools_parse_and_a_loop(server: Server, proxy: RecordingProxy) -> None:
    import openai

    client = openai.OpenAI(base_url=proxy.url, api_key="unused", max_retries=0)
    tool = openai.pydantic_function_tool(WeatherArgs, name="get_weather", description="The weather in a city.")
    ask = [{"role": "user", "content": ASK}]
    common: dict[str, Any] = {"model": server.model, "temperature": 1.0, "seed": SEED, "max_tokens": MAX_TOKENS}

    def quickstart() -> Any:
        tools = Tools()
        # Tools, forced: the call comes back parsed against the tool's own (strict) schema.
        r = client.chat.completions.parse(messages=ask, tools=[tool], tool_choice="required", **common)
        calls = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls" and calls
        parsed = [c.function.parsed_arguments for c in calls]
        assert all(isinstance(p, WeatherArgs) for p in parsed), parsed
        # Streamed tools: the stream helper assembles the same call.
        with client.chat.completions.stream(messages=ask, tools=[tool], tool_choice="required", **common) as s:
            final = s.get_final_completion()
        assert [c.function.arguments for c in final.choices[0].message.tool_calls] == \
            [c.function.arguments for c in calls]
        assert final.choices[0].message.content is None  # not '' (no empty content delta)
        # The loop: run the tools, send their results, get the answer in the response format.
        messages: list[Any] = [*ask, r.choices[0].message.model_dump(exclude_none=True)]
        for c in calls:
            args = c.function.parsed_arguments
            messages.append({"role": "tool", "tool_call_id": c.id, "content": tools.get_weather(args.city, args.days)})
        answer = client.chat.completions.parse(messages=messages, tools=[tool], response_format=Report, **common)
        # `parse` without tools: structured output.
        alone = client.chat.completions.parse(messages=ask, response_format=Report, **common)
        return ([p.model_dump() for p in parsed], answer.choices[0].message.parsed, answer.choices[0].message.tool_calls,
                alone.choices[0].message.parsed)

    t = run_twice(server, proxy, quickstart)
    parsed, answer, later_calls, alone = t.outputs[0]
    assert t.outputs[0] == t.outputs[1]
    assert isinstance(alone, Report)
    assert isinstance(answer, Report) or later_calls, answer  # auto + format: an answer or more calls
    assert len(tool_calls(t.first)) >= 2 * len(parsed)  # the forced call and its streamed twin


# -- the OpenAI Agents SDK ------------------------------------------------------------------------


def agents_model(server: Server, proxy: RecordingProxy) -> Any:
    from agents import OpenAIChatCompletionsModel, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    return OpenAIChatCompletionsModel(model=server.model,
                                      openai_client=AsyncOpenAI(base_url=proxy.url, api_key="unused", max_retries=0))


def agents_tool(tools: Tools) -> Any:
    from agents import function_tool

    @function_tool
    def get_weather(city: City, days: Annotated[int, Field(ge=1, le=7)]) -> str:
        """The weather in a city."""
        return tools.get_weather(city, days)

    return get_weather


def test_openai_agents_function_tool_output_type_and_a_streamed_run(server: Server, proxy: RecordingProxy) -> None:
    from agents import Agent, ModelSettings, Runner

    model = agents_model(server, proxy)
    # tool_choice "required": the SDK resets it to auto after the first tool call (reset_tool_choice).
    settings = ModelSettings(tool_choice="required", temperature=1.0, max_tokens=MAX_TOKENS, extra_body={"seed": SEED})

    def quickstart() -> Any:
        tools = Tools()
        plain = Agent(name="weather", instructions="Answer briefly.", tools=[agents_tool(tools)], model=model,
                      model_settings=settings)
        text = Runner.run_sync(plain, ASK, max_turns=6).final_output
        typed = Agent(name="typed", instructions="Answer briefly.", tools=[agents_tool(tools)], model=model,
                      model_settings=settings, output_type=Report)
        report = Runner.run_sync(typed, ASK, max_turns=6).final_output

        async def streamed() -> Any:
            run = Runner.run_streamed(typed, ASK, max_turns=6)
            kinds = [e.type async for e in run.stream_events()]
            return run.final_output, "raw_response_event" in kinds

        streamed_report, saw_events = asyncio.run(streamed())
        return text, report, streamed_report, saw_events, [c.model_dump() for c in tools.calls]

    t = run_twice(server, proxy, quickstart)
    text, report, streamed_report, saw_events, calls = t.outputs[0]
    assert t.outputs[0] == t.outputs[1]
    assert isinstance(text, str)
    assert isinstance(report, Report) and streamed_report == report  # streamed and not agree
    assert saw_events
    assert len(calls) >= 3  # each of the three runs called the tool (with valid arguments)
    # The typed runs: a call under required + response_format, then the answer in the format.
    assert sum(r.finish == "tool_calls" for r in t.first) >= 3


# -- pydantic-ai ----------------------------------------------------------------------------------


def test_pydantic_ai_tool_with_structured_output_and_native_output_with_tools(server: Server,
                                                                             proxy: RecordingProxy) -> None:
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    class ToolFirst(AbstractCapability):
        """pydantic-ai's way to force a tool on the first step only (its tool_choice docs)."""

        def get_model_settings(self) -> Any:
            return lambda ctx: {"tool_choice": "required"} if ctx.run_step <= 1 else {}

    model = OpenAIChatModel(server.model, provider=OpenAIProvider(base_url=proxy.url, api_key="unused"))
    # One call a step: a random-weight model, free to make parallel calls, makes them until max_tokens.
    settings: Any = {"temperature": 1.0, "max_tokens": MAX_TOKENS, "seed": SEED, "parallel_tool_calls": False}

    def quickstart() -> Any:
        tools = Tools()
        out = []
        # The default (a tool output: pydantic-ai sends tool_choice "required" with its
        # final_result tool), then NativeOutput (response_format) with the tool forced first.
        for output_type, caps in ((Report, []), (NativeOutput(Report), [ToolFirst()])):
            agent = Agent(model, output_type=output_type, instructions="Answer briefly.", model_settings=settings,
                          capabilities=caps)

            @agent.tool_plain
            def get_weather(city: City, days: Annotated[int, Field(ge=1, le=7)]) -> str:
                """The weather in a city."""
                return tools.get_weather(city, days)

            out.append(agent.run_sync(ASK).output)
        return out, [c.model_dump() for c in tools.calls]

    t = run_twice(server, proxy, quickstart)
    (tool_output, native_output), calls = t.outputs[0]
    assert t.outputs[0] == t.outputs[1]
    assert isinstance(tool_output, Report) and isinstance(native_output, Report)
    assert calls  # the tool ran with valid arguments
    native = [x for x in proxy.exchanges if (x.request_json() or {}).get("response_format")]
    assert any(assemble(x).calls for x in native)  # a tool call under response_format


# -- langchain-openai -----------------------------------------------------------------------------


def test_langchain_bind_tools_streamed_and_structured_output(server: Server, proxy: RecordingProxy) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=server.model, base_url=proxy.url, api_key="unused", temperature=1.0, seed=SEED,
                     max_tokens=MAX_TOKENS, max_retries=0)

    def quickstart() -> Any:
        tools = Tools()

        @tool
        def get_weather(city: City, days: Annotated[int, Field(ge=1, le=7)]) -> str:
            """The weather in a city."""
            return tools.get_weather(city, days)

        bound = llm.bind_tools([get_weather], tool_choice="any")
        msg = bound.invoke(ASK)
        chunks = list(bound.stream(ASK))
        streamed = chunks[0]
        for c in chunks[1:]:
            streamed = streamed + c
        assert msg.tool_calls and [c["args"] for c in streamed.tool_calls] == [c["args"] for c in msg.tool_calls]
        # The loop: run the tool, hand the results back, let the model answer.
        history: list[Any] = [HumanMessage(ASK), msg]
        history += [ToolMessage(get_weather.invoke(c["args"]), tool_call_id=c["id"]) for c in msg.tool_calls]
        follow = llm.bind_tools([get_weather]).invoke(history)
        report = llm.with_structured_output(Report, method="json_schema").invoke(ASK)
        return [c["args"] for c in msg.tool_calls], follow.content, report, [c.model_dump() for c in tools.calls]

    t = run_twice(server, proxy, quickstart)
    args, _, report, calls = t.outputs[0]
    assert t.outputs[0] == t.outputs[1]
    assert args and all(WeatherArgs.model_validate(a) for a in args)
    assert isinstance(report, Report) and calls


# -- litellm --------------------------------------------------------------------------------------


def test_litellm_tools_streamed_tools_and_response_format(server: Server, proxy: RecordingProxy) -> None:
    import litellm

    tool = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                             "parameters": WeatherArgs.model_json_schema()}}
    common: dict[str, Any] = {"model": f"openai/{server.model}", "api_base": proxy.url, "api_key": "unused",
                              "messages": [{"role": "user", "content": ASK}], "temperature": 1.0, "seed": SEED,
                              "max_tokens": MAX_TOKENS}

    def quickstart() -> Any:
        r = litellm.completion(tools=[tool], tool_choice="required", **common)
        calls = [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls]
        chunks = list(litellm.completion(tools=[tool], tool_choice="required", stream=True, **common))
        streamed = litellm.stream_chunk_builder(chunks)
        assert [(c.function.name, c.function.arguments) for c in streamed.choices[0].message.tool_calls] == calls
        report = litellm.completion(response_format=Report, **common).choices[0].message.content
        return calls, Report.model_validate_json(report)

    t = run_twice(server, proxy, quickstart)
    calls, report = t.outputs[0]
    assert t.outputs[0] == t.outputs[1]
    assert calls and all(WeatherArgs.model_validate_json(a) for _, a in calls)
    assert isinstance(report, Report)


# -- instructor (its own environment) -------------------------------------------------------------


def test_instructor_tools_and_json_schema_modes(server: Server, proxy: RecordingProxy) -> None:
    if not INSTRUCTOR_PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{INSTRUCTOR_PYTHON} is missing: `make test` (scripts/client_envs.sh) builds it")
        pytest.skip("no .venv-instructor: run `make test` (scripts/client_envs.sh) to build instructor's env")
    script = Path(__file__).parents[1] / "clients" / "instructor_quickstart.py"

    def quickstart() -> Any:
        r = subprocess.run([str(INSTRUCTOR_PYTHON), str(script), proxy.url, server.model, str(SEED)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout)

    t = run_twice(server, proxy, quickstart)
    out = t.outputs[0]
    assert t.outputs[0] == t.outputs[1]
    assert out["instructor"] == INSTRUCTOR_VERSION
    assert set(out["replies"]) == {"tool_call", "json_schema_mode"}, out
    for reply in out["replies"].values():
        assert set(reply) == {"city", "days", "sunny"} and reply["city"] in ("Paris", "Rome", "Oslo")
        assert 1 <= reply["days"] <= 7
    # TOOLS mode is a named tool_choice: exactly one call.
    named = [r for r in t.first if r.calls]
    assert len(named) == 1 and len(named[0].calls) == 1, named


INSTRUCTOR_VERSION = "1.17.0"  # tests/clients/instructor.txt


def test_the_versions_tried_are_the_pinned_ones() -> None:
    """docs/agents.md names the versions its table was made with: these."""
    doc = (ROOT / "docs" / "agents.md").read_text()
    for dist in ("openai", "openai-agents", "pydantic-ai-slim", "langchain-openai", "litellm", "anthropic"):
        version = importlib.metadata.version(dist)
        assert f"{dist} {version}" in doc, (dist, version)
    pins = (Path(__file__).parents[1] / "clients" / "instructor.txt").read_text()
    assert f"instructor=={INSTRUCTOR_VERSION}" in pins and f"instructor {INSTRUCTOR_VERSION}" in doc
    assert sys.version_info >= (3, 11)


# -- openai: chat completions as the tutorials write it (issue 47) ----------------------------------


def test_openai_tutorial_loop_sends_model_dump_back_with_names_and_streams_argument_fragments(
        server: Server, proxy: RecordingProxy) -> None:
    """The tutorial agent loop appends `message.model_dump()` (its refusal, annotations, audio and
    function_call null) and names its participants; a streamed call's arguments arrive in
    fragments, each a prefix of the final arguments (what instructor's partial streaming and
    LangChain's tool_call_chunks read)."""
    import openai

    client = openai.OpenAI(base_url=proxy.url, api_key="unused", max_retries=0)
    tool = openai.pydantic_function_tool(WeatherArgs, name="get_weather", description="The weather in a city.")
    common: dict[str, Any] = {"model": server.model, "temperature": 1.0, "seed": SEED, "max_tokens": MAX_TOKENS}

    def quickstart() -> Any:
        tools = Tools()
        messages: list[Any] = [{"role": "system", "content": "Answer briefly.", "name": "setup"},
                               {"role": "user", "content": ASK, "name": "alice"}]
        r = client.chat.completions.create(messages=messages, tools=[tool], tool_choice="required", **common)
        messages.append(r.choices[0].message.model_dump())  # nulls and all, as the tutorials do
        for c in r.choices[0].message.tool_calls:
            args = WeatherArgs.model_validate_json(c.function.arguments)
            messages.append({"role": "tool", "tool_call_id": c.id, "content": tools.get_weather(args.city, args.days)})
        answer = client.chat.completions.create(messages=messages, tools=[tool], **common)
        fragments: list[list[str]] = []
        for chunk in client.chat.completions.create(messages=messages[:2], tools=[tool], tool_choice="required",
                                                    stream=True, **common):
            for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                while len(fragments) <= tc.index:
                    fragments.append([])
                fragments[tc.index].append(tc.function.arguments or "")
        return ([c.function.arguments for c in r.choices[0].message.tool_calls], answer.choices[0].finish_reason,
                fragments)

    t = run_twice(server, proxy, quickstart)
    arguments, _, fragments = t.outputs[0]
    assert t.outputs[0] == t.outputs[1]
    assert ["".join(f) for f in fragments] == arguments  # the streamed call is the non-streamed one
    assert all(len([f for f in call if f]) > 1 for call in fragments), fragments  # in pieces, as decoded
    for call, whole in zip(fragments, arguments):
        so_far = ""
        for piece in call:
            so_far += piece
            assert whole.startswith(so_far)
    sent = [x.request_json() for x in proxy.exchanges if x.path.endswith("/chat/completions")]
    assert any(m.get("refusal", 1) is None for req in sent for m in req["messages"])  # nulls went out and were taken


# -- openai: the Responses API -----------------------------------------------------------------------


def _responses_tool() -> dict[str, Any]:
    import openai

    fn = openai.pydantic_function_tool(WeatherArgs, name="get_weather", description="The weather in a city.")
    return {"type": "function", **fn["function"]}  # the Responses API's flat form


def test_openai_responses_create_stream_tool_round_trip_and_previous_response_id(server: Server,
                                                                                 proxy: RecordingProxy) -> None:
    import openai

    client = openai.OpenAI(base_url=proxy.url, api_key="unused", max_retries=0)
    tool = _responses_tool()
    common: dict[str, Any] = {"model": server.model, "temperature": 1.0, "max_output_tokens": MAX_TOKENS,
                              "extra_body": {"seed": SEED}, "tools": [tool]}

    def quickstart() -> Any:
        tools = Tools()
        text = client.responses.create(model=server.model, input=ASK, max_output_tokens=8,
                                       instructions="Answer briefly.", extra_body={"seed": SEED})
        assert text.status == "incomplete" and text.incomplete_details.reason == "max_output_tokens"
        r = client.responses.create(input=ASK, tool_choice="required", **common)
        calls = [o for o in r.output if o.type == "function_call"]
        assert r.status == "completed" and calls
        with client.responses.stream(input=ASK, tool_choice="required", **common) as s:
            kinds = [e.type for e in s]
            streamed = s.get_final_response()
        assert [(c.name, c.arguments) for c in streamed.output if c.type == "function_call"] == \
            [(c.name, c.arguments) for c in calls]
        assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"
        outputs = [{"type": "function_call_output", "call_id": c.call_id,
                    "output": tools.get_weather(**json.loads(c.arguments))} for c in calls]
        # The round trip: the whole conversation sent back, then the same through previous_response_id.
        whole = client.responses.create(input=[{"role": "user", "content": ASK},
                                               *[o.model_dump(exclude_none=True) for o in r.output], *outputs],
                                        **common)
        chained = client.responses.create(previous_response_id=r.id, input=outputs, **common)
        same = [(o.type, getattr(o, "arguments", None)) for o in chained.output] == \
            [(o.type, getattr(o, "arguments", None)) for o in whole.output]
        return [c.arguments for c in calls], whole.output_text, chained.output_text, same, chained.usage.model_dump()

    t = run_twice(server, proxy, quickstart, path="/responses")
    arguments, whole, chained, same, usage = t.outputs[0]
    assert t.outputs[0][:4] == t.outputs[1][:4]
    assert arguments and same and whole == chained
    # previous_response_id rebuilt the conversation exactly: it restored the whole-input request's prompt
    assert usage["input_tokens_details"]["cached_tokens"] == usage["input_tokens"] - 1


def test_openai_agents_default_model_runs_an_agent_with_a_tool(server: Server, proxy: RecordingProxy) -> None:
    """The Agents SDK's default model speaks the Responses API."""
    from agents import Agent, ModelSettings, Runner, set_default_openai_api, set_default_openai_client, \
        set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    set_default_openai_client(AsyncOpenAI(base_url=proxy.url, api_key="unused", max_retries=0), use_for_tracing=False)
    set_default_openai_api("responses")
    settings = ModelSettings(tool_choice="required", temperature=1.0, max_tokens=MAX_TOKENS, extra_body={"seed": SEED})
    try:
        def quickstart() -> Any:
            tools = Tools()
            # A structured answer: a random-weight model's free text would run to max_output_tokens,
            # an incomplete response, which the SDK (as with OpenAI) raises on.
            agent = Agent(name="weather", instructions="Answer briefly.", tools=[agents_tool(tools)],
                          model=server.model, model_settings=settings, output_type=Report)
            out = Runner.run_sync(agent, ASK, max_turns=6).final_output
            return out, [c.model_dump() for c in tools.calls]

        t = run_twice(server, proxy, quickstart, path="/responses")
    finally:
        set_default_openai_api("chat_completions")
    out, calls = t.outputs[0]
    assert t.outputs[0] == t.outputs[1]
    assert isinstance(out, Report) and calls  # the tool ran with valid arguments, then the agent answered
    assert t.first[0].finish == "tool_calls"


# -- anthropic: the Messages API ---------------------------------------------------------------------


def test_anthropic_messages_create_stream_tool_round_trip_and_count_tokens(server: Server,
                                                                         proxy: RecordingProxy) -> None:
    """The Messages API has no seed: the server's (`serve --seed`) makes the run replay."""
    import anthropic

    client = anthropic.Anthropic(base_url=proxy.url.rsplit("/v1", 1)[0], api_key="unused", max_retries=0)
    tool = {"name": "get_weather", "description": "The weather in a city.",
            "input_schema": WeatherArgs.model_json_schema()}
    ask = [{"role": "user", "content": ASK}]
    common: dict[str, Any] = {"model": server.model, "max_tokens": MAX_TOKENS, "system": "Answer briefly.",
                              "tools": [tool], "extra_body": {"seed": SEED}}

    def quickstart() -> Any:
        tools = Tools()
        text = client.messages.create(model=server.model, max_tokens=6, messages=ask, extra_body={"seed": SEED})
        assert text.stop_reason == "max_tokens" and text.content[0].type == "text"
        r = client.messages.create(messages=ask, tool_choice={"type": "any"}, **common)
        uses = [b for b in r.content if b.type == "tool_use"]
        assert r.stop_reason == "tool_use" and uses
        with client.messages.stream(messages=ask, tool_choice={"type": "any"}, **common) as s:
            kinds = [e.type for e in s]
            streamed = s.get_final_message()
        assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == [(b.name, b.input) for b in uses]
        assert "input_json" in kinds
        results = [{"type": "tool_result", "tool_use_id": b.id, "content": tools.get_weather(**b.input)} for b in uses]
        history = [*ask, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
                   {"role": "user", "content": results}]
        answer = client.messages.create(messages=history, **common)
        counted = client.messages.count_tokens(model=server.model, messages=history, system="Answer briefly.",
                                               tools=[tool]).input_tokens
        u = answer.usage
        return [b.input for b in uses], answer.stop_reason, counted, \
            u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens

    t = run_twice(server, proxy, quickstart, path="/messages")
    inputs, _, counted, prompt = t.outputs[0]
    assert t.outputs[0] == t.outputs[1]
    assert inputs and all(WeatherArgs.model_validate(i) for i in inputs)
    assert counted == prompt  # count_tokens counts the prompt the reply was made from
