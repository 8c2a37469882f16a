"""The harnesses' real first requests, as recorded (tests/clients/harnesses/*-first-request.json),
through the server over HTTP on 127.0.0.1 (issue 47). What Codex CLI 0.171.0 and Claude Code
2.1.332 send by default and today's formats did not take:

- Codex: a `namespace` tool (its sub-agent tools: offered as `namespace.name`, and a call to one
  comes back with its `namespace`; sent back the same way) and a `web_search` tool (this server
  searches nothing: left out, listed in `verbatim.ignored`).
- Claude Code: its billing header as the first system block (a hash that changes with every
  request: left out of the prompt, or no two requests would share more than ~10 tokens), a
  `system` role inside `messages`, and a tool with `defer_loading` (left out until a tool search
  loads it, as Anthropic's API does).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from engine.serve.formats import responses
from tests import harness_runs as H
from tests.server_helpers import Server, post
from tests.tiny_models import HARNESS_CONTEXT, build_harness_model


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = build_harness_model(tmp_path_factory.mktemp("models") / "harness")
    s = Server(folder, None, chunk=512, seed=7)
    s.engine(lambda e: setattr(e, "context_length", HARNESS_CONTEXT))
    yield s
    s.close()


def send(s: Server, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    recorded = H.recorded(kind)
    status, reply = post(s, recorded["path"], {**body, "model": s.model, "stream": False},
                         headers={"x-api-key": "unused", "anthropic-version": "2023-06-01"})
    assert status == 200, reply
    return reply


def test_codex_first_request_namespace_and_web_search(server: Server) -> None:
    body = H.recorded("codex")["body"]
    kinds = [t["type"] for t in body["tools"]]
    assert "namespace" in kinds and "web_search" in kinds  # what Codex CLI 0.171.0 sends by default
    reply = send(server, "codex", body)
    assert f"tools[{kinds.index('web_search')}]" in reply["verbatim"]["ignored"]
    assert reply["status"] in ("completed", "incomplete")
    # The namespace's tools are offered by their qualified names.
    ns = next(t for t in body["tools"] if t["type"] == "namespace")
    parsed = responses.parse({**body, "stream": False})
    offered = parsed.request.constraint.tool_names()
    assert [f"{ns['name']}.{t['name']}" for t in ns["tools"]] == [n for n in offered if n.startswith(ns["name"] + ".")]
    assert "web_search" not in offered
    # A call to one comes back with its namespace, and goes in again the same way.
    fn = ns["tools"][0]["name"]
    assert responses._namespaced(f"{ns['name']}.{fn}", body) == {"name": fn, "namespace": ns["name"]}
    assert responses._namespaced("exec_command", body) == {"name": "exec_command"}
    again = responses.parse({**body, "input": body["input"] + [
        {"type": "function_call", "call_id": "call_1", "name": fn, "namespace": ns["name"], "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "ok"}]})
    call = again.request.messages[-2]["tool_calls"][0]
    assert call["function"]["name"] == f"{ns['name']}.{fn}"


def test_claude_code_first_request_is_taken_and_its_billing_header_left_out(server: Server) -> None:
    body = H.recorded("claude")["body"]
    assert body["system"][0]["text"].startswith("x-anthropic-billing-header:")
    assert any(m["role"] == "system" for m in body["messages"])
    assert any(t.get("defer_loading") for t in body["tools"])
    first = send(server, "claude", body)
    assert "system[0]" in first["verbatim"]["ignored"]
    # The next request's billing header differs (its hash covers the request): the same prompt all
    # the same, so it restores the first one's but its last token.
    header = body["system"][0]["text"].replace("cc_version=2.1.332.", "cc_version=2.1.332.f")
    second = send(server, "claude", {**body, "system": [{**body["system"][0], "text": header}, *body["system"][1:]]})
    v = second["verbatim"]
    assert v["prompt_tokens"] == first["verbatim"]["prompt_tokens"] and v["restored"] == v["prompt_tokens"] - 1
    assert second["content"] == first["content"]
