"""Three wire formats over one engine path (issue 47): the same conversation through chat
completions, Responses and Messages renders the same prompt tokens (and the cache serves all
three); Anthropic's usage split, stop reasons, error envelope and keys; the Responses store;
`serve --seed`; the fields accepted and listed as ignored. Real HTTP on 127.0.0.1 against the
tiny tool model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.engine_helpers import require_openblas
from tests.server_helpers import Server, post

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
SYSTEM, ASK, TOLD = "Answer briefly.", "What is the weather in Paris?", '{"sunny": true}'
LOOK = "Let me look."  # an assistant's text before its call: one message with it in every format


@pytest.fixture(scope="module")
def folder(tool_model: Path) -> Path:
    """The tool model (tests/conftest.py), for tests whose exact comparisons need an optimized BLAS."""
    require_openblas()
    return tool_model


@pytest.fixture(scope="module")
def server(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(folder, tmp_path_factory.mktemp("formats-cache"), api_keys=["k1"], seed=11)
    yield s
    s.close()


def three_ways(call_id: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """One conversation (a system prompt, a question, a reply's text and its call, the call's
    result) in each wire format."""
    args = {"city": "Paris", "days": 2}
    tool = {"name": "get_weather", "description": "The weather.", "parameters": WEATHER}
    chat = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK},
                         {"role": "assistant", "content": LOOK, "tool_calls": [
                             {"id": call_id, "type": "function",
                              "function": {"name": "get_weather", "arguments": json.dumps(args)}}]},
                         {"role": "tool", "tool_call_id": call_id, "content": TOLD}],
            "tools": [{"type": "function", "function": tool}]}
    responses = {"instructions": SYSTEM, "tools": [{"type": "function", **tool}],
                 "input": [{"role": "user", "content": ASK},
                           {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": LOOK}]},
                           {"type": "function_call", "call_id": call_id, "name": "get_weather",
                            "arguments": json.dumps(args)},
                           {"type": "function_call_output", "call_id": call_id, "output": TOLD}]}
    messages = {"system": SYSTEM, "max_tokens": 6,
                "tools": [{"name": "get_weather", "description": "The weather.", "input_schema": WEATHER}],
                "messages": [{"role": "user", "content": ASK},
                             {"role": "assistant", "content": [{"type": "text", "text": LOOK},
                                                               {"type": "tool_use", "id": call_id,
                                                                "name": "get_weather", "input": args}]},
                             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id,
                                                           "content": TOLD}]}]}
    return {"chat": ("/v1/chat/completions", {**chat, "max_tokens": 6}),
            "responses": ("/v1/responses", {**responses, "max_output_tokens": 6}),
            "messages": ("/v1/messages", messages)}


def test_one_conversation_renders_the_same_prompt_through_all_three_formats(server: Server) -> None:
    ways = three_ways("call_same")
    prompts, restored = {}, {}
    for name, (path, body) in ways.items():
        code, out = post(server, path, {**body, "verbatim": {"mode": "exact"}})
        assert code == 200, out
        result = server.recording.results[-1]
        prompts[name], restored[name] = result.prompt_ids, result.report.restored
    assert prompts["chat"] == prompts["responses"] == prompts["messages"]
    # The second and third format's request is a regenerate of the first's prompt: restored - 1.
    assert restored["responses"] == restored["messages"] == len(prompts["chat"]) - 1


def test_anthropic_usage_split_stop_reasons_and_the_seed_of_the_server(server: Server) -> None:
    body = {"max_tokens": 12, "messages": [{"role": "user", "content": "Hello there"}]}
    code, first = post(server, "/v1/messages", body, {"x-api-key": "k1", "anthropic-version": "2023-06-01"})
    assert code == 200, first
    u, report = first["usage"], first["verbatim"]
    assert u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"] == report["prompt_tokens"]
    assert u["cache_read_input_tokens"] == report["restored"] == 0 and u["cache_creation_input_tokens"] > 0
    assert report["seed"] == 11 and first["stop_reason"] == "max_tokens"  # no seed in the Messages API: the server's
    code, again = post(server, "/v1/messages?beta=true", body, {"x-api-key": "k1"})
    assert again["content"] == first["content"] and again["id"] == first["id"]
    u = again["usage"]
    assert u["cache_read_input_tokens"] == again["verbatim"]["prompt_tokens"] - 1 == again["verbatim"]["restored"]
    # A stop sequence that the reply reaches: stop_reason stop_sequence, naming it.
    text = first["content"][0]["text"]
    stop = text[3:5]
    code, stopped = post(server, "/v1/messages", {**body, "stop_sequences": [stop]}, {"x-api-key": "k1"})
    assert stopped["stop_reason"] == "stop_sequence" and stopped["stop_sequence"] == stop, stopped
    assert stopped["content"][0]["text"] == text[:text.index(stop)]


def test_anthropic_errors_come_in_anthropics_envelope(server: Server) -> None:
    code, body = post(server, "/v1/messages", {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
                      {"x-api-key": "wrong"})
    assert code == 401 and body["type"] == "error" and body["error"]["type"] == "authentication_error"
    code, body = post(server, "/v1/messages", {"messages": [{"role": "user", "content": "x"}]}, {"x-api-key": "k1"})
    assert code == 400 and body["error"] == {"type": "invalid_request_error", "message": "'max_tokens' is required"}
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    code, body = post(server, "/v1/messages", {"max_tokens": 5, "messages": [{"role": "user", "content": [image]}]},
                      {"x-api-key": "k1"})
    assert code == 400 and "messages[0].content[0]: 'image' blocks" in body["error"]["message"]
    code, body = post(server, "/v1/messages", {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                                               "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
                      {"x-api-key": "k1"})
    assert code == 400 and "tools[0]" in body["error"]["message"]


def test_harness_fields_are_accepted_and_listed_as_ignored(server: Server) -> None:
    code, out = post(server, "/v1/messages", {
        "max_tokens": 3, "messages": [{"role": "user", "content": [{"type": "text", "text": "x",
                                                                     "cache_control": {"type": "ephemeral"}}]}],
        "metadata": {"user_id": "u"}, "thinking": {"type": "disabled"}, "context_management": {"edits": []},
        "output_config": {"effort": "low"}}, {"x-api-key": "k1"})
    assert code == 200, out
    assert set(out["verbatim"]["ignored"]) == {"metadata", "thinking", "context_management", "output_config.effort",
                                               "messages[0].content[0].cache_control"}
    code, out = post(server, "/v1/responses", {
        "input": "x", "max_output_tokens": 3, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "p",
        "reasoning": {"effort": "low"}, "store": False, "client_metadata": {"a": "b"}, "parallel_tool_calls": False,
        "text": {"verbosity": "low"}})
    assert code == 200, out
    assert set(out["verbatim"]["ignored"]) == {"include", "prompt_cache_key", "reasoning.effort", "client_metadata",
                                               "text.verbosity", "parallel_tool_calls"}
    code, out = post(server, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "prompt_cache_key": "p",
        "safety_identifier": "s", "service_tier": "auto", "reasoning_effort": "low", "verbosity": "low"})
    assert code == 200 and set(out["verbatim"]["ignored"]) == {"prompt_cache_key", "safety_identifier",
                                                               "service_tier", "reasoning_effort", "verbosity"}
    # What would change the reply and cannot be honoured is still refused, by name; a web search
    # (Codex CLI offers one by default) is left out: the model is offered no search.
    code, out = post(server, "/v1/responses", {"input": "x", "tools": [{"type": "file_search",
                                                                       "vector_store_ids": ["vs_1"]}]})
    assert code == 400 and out["error"]["param"] == "tools[0].type"
    code, out = post(server, "/v1/responses", {"input": "x", "max_output_tokens": 3,
                                               "tools": [{"type": "web_search", "external_web_access": False}]})
    assert code == 200 and out["verbatim"]["ignored"] == ["tools[0]"] and out["tools"][0]["type"] == "web_search"


def test_the_responses_store_per_key_delete_store_false_and_unknown_ids(folder: Path,
                                                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    s = Server(folder, None, api_keys=["k1", "k2"])
    try:
        code, r = post(s, "/v1/responses", {"input": "Hello", "max_output_tokens": 3})
        assert code == 200 and r["id"].startswith("resp_")
        assert post(s, f"/v1/responses/{r['id']}", {}, method="GET")[1]["output"] == r["output"]
        other = {"Authorization": "Bearer k2"}  # another key's namespace never sees it
        code, err = post(s, f"/v1/responses/{r['id']}", {}, other, method="GET")
        assert code == 404 and err["error"]["param"] == "response_id"
        code, err = post(s, "/v1/responses", {"input": "Hi", "previous_response_id": r["id"]}, other)
        assert code == 404 and err["error"]["param"] == "previous_response_id" and r["id"][:20] in err["error"]["message"]
        code, gone = post(s, f"/v1/responses/{r['id']}", {}, method="DELETE")
        assert code == 200 and gone == {"id": r["id"], "object": "response", "deleted": True}
        assert post(s, f"/v1/responses/{r['id']}", {}, method="GET")[0] == 404
        code, kept = post(s, "/v1/responses", {"input": "Hola", "max_output_tokens": 3, "store": False})
        assert code == 200 and post(s, f"/v1/responses/{kept['id']}", {}, method="GET")[0] == 404
        # Without --seed: a fresh seed per request, reported.
        seeds = {post(s, "/v1/responses", {"input": "Hello", "max_output_tokens": 2, "store": False})[1]
                 ["verbatim"]["seed"] for _ in range(3)}
        assert len(seeds) > 1
    finally:
        s.close()


def test_the_store_evicts_the_least_recently_used() -> None:
    from engine.serve.formats.responses import ResponseStore
    from engine.serve.schema import APIError

    store = ResponseStore(limit=2)
    for i in range(3):
        store.put("ns", {"id": f"r{i}"}, [])
    with pytest.raises(APIError) as e:
        store.get("ns", "r0")
    assert e.value.status == 404
    assert store.get("ns", "r2").response == {"id": "r2"}


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_a_responses_or_messages_receipt_records_the_request_as_sent_and_verify_replays_it(
        server: Server, folder: Path, tmp_path: Path, api: str) -> None:
    import subprocess
    import sys

    path, body = three_ways("call_r")[api]
    body = {**body, "temperature": 1.0, "verbatim": {"receipt": True}}
    code, out = post(server, path, body, {"x-api-key": "k1"} if api == "messages" else None)
    assert code == 200, out
    receipt = out["verbatim"]["receipt"]
    assert receipt["wire"] == {"api": api, "request": body} and receipt["sampler"]["seed"] == 11
    file = tmp_path / "receipt.json"
    file.write_text(json.dumps(receipt))
    r = subprocess.run([sys.executable, "-m", "engine", "verify", str(file), "--model", str(folder), "--no-cache"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("OK:") and "note:" not in r.stderr, r.stderr
    # An edited recorded request no longer reads as the receipt's: said, and the replay still runs.
    edited = {**receipt, "wire": {"api": api, "request": {**body, "max_tokens" if api == "messages"
                                                           else "max_output_tokens": 5, "temperature": 0.5}}}
    file.write_text(json.dumps(edited))
    r = subprocess.run([sys.executable, "-m", "engine", "verify", str(file), "--model", str(folder), "--no-cache"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "reads as another request here" in r.stderr, r.stderr


def test_reasoning_effort_goes_to_a_template_that_reads_it_in_every_format(tmp_path: Path) -> None:
    """gpt-oss's template reads `reasoning_effort`: chat's reasoning_effort, Responses'
    reasoning.effort and Messages' output_config.effort go to it (not listed as ignored), and the
    prompt says so; the tool model's template reads none (listed as ignored, above)."""
    from tests.tiny_models import OPTIONS_TEMPLATE, build_templated_model

    s = Server(build_templated_model(tmp_path / "reads", OPTIONS_TEMPLATE), None)
    try:
        asks = {"/v1/chat/completions": {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2,
                                         "reasoning_effort": "high"},
                "/v1/responses": {"input": "x", "max_output_tokens": 2, "reasoning": {"effort": "high"}},
                "/v1/messages": {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2,
                                 "output_config": {"effort": "high"}}}
        prompts = []
        for path, body in asks.items():
            code, out = post(s, path, body, {})
            assert code == 200 and out["verbatim"]["ignored"] == [], out
            prompts.append(s.engine(lambda e: e.lm.tokenizer.decode(s.recording.results[-1].prompt_ids)))
        assert all("Reasoning: high" in p for p in prompts) and len(set(prompts)) == 1, prompts
        code, out = post(s, "/v1/chat/completions", {**asks["/v1/chat/completions"], "reasoning_effort": "low"}, {})
        assert "Reasoning: low" in s.engine(lambda e: e.lm.tokenizer.decode(s.recording.results[-1].prompt_ids))
    finally:
        s.close()


def test_a_reply_sent_back_as_model_dump_and_a_named_message_are_accepted(server: Server) -> None:
    """The tutorial loop: `messages.append(r.choices[0].message.model_dump())` sends the reply back
    with refusal, annotations, audio and function_call null (null is absent); LangChain names its
    messages (kept for the chat template: this one renders no names, so the prompt is as without)."""
    import openai

    client = openai.OpenAI(base_url=server.url, api_key="k1", max_retries=0)
    ask = [{"role": "user", "content": ASK}]
    r = client.chat.completions.create(model=server.model, messages=ask, max_tokens=4, seed=1)
    dumped = r.choices[0].message.model_dump()
    assert {"refusal", "annotations", "audio", "function_call"} <= {k for k, v in dumped.items() if v is None}
    again = client.chat.completions.create(model=server.model, messages=[*ask, dumped, *ask], max_tokens=2, seed=1)
    assert again.choices[0].finish_reason in ("stop", "length")
    plain = server.recording.results[-1].prompt_ids
    named = client.chat.completions.create(model=server.model, max_tokens=2, seed=1,
                                           messages=[*ask[:0], {**ask[0], "name": "alice"}, dumped,
                                                     {**ask[0], "name": "alice"}])
    assert named.choices[0].finish_reason in ("stop", "length")
    assert server.recording.results[-1].prompt_ids == plain  # a template without names renders none


def test_a_responses_chain_keeps_the_files_its_first_input_attached(server: Server) -> None:
    """An input_file is a document of the whole chain: a response that continues one through
    previous_response_id is answered with the file still in its prompt (restored with it from
    the cache), as the conversation is."""
    import base64

    text = "The lighthouse keeper's log. Day 1: fog. Day 2: the lamp was cleaned. Day 3: a ship passed. " * 8
    data = "data:text/plain;base64," + base64.b64encode(text.encode()).decode()
    first = {"input": [{"role": "user", "content": [
        {"type": "input_file", "filename": "log.txt", "file_data": data},
        {"type": "input_text", "text": "What happened on day 2?"}]}], "max_output_tokens": 4}
    code, r1 = post(server, "/v1/responses", first)
    assert code == 200, r1
    named = [d["name"] for d in r1["verbatim"]["documents"]]
    assert named == ["log.txt"]
    code, r2 = post(server, "/v1/responses", {"input": "And on day 3?", "previous_response_id": r1["id"],
                                              "max_output_tokens": 4})
    assert code == 200, r2
    assert [d["name"] for d in r2["verbatim"].get("documents", [])] == ["log.txt"]
    # The follow-up's prompt holds the first's whole prompt: restored, the document with it.
    assert r2["verbatim"]["restored"] >= r1["verbatim"]["prompt_tokens"] - 1
    assert r2["id"] != r1["id"]
