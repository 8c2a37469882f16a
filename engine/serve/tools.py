"""Tools and structured output on the server: request fields in, OpenAI tool_calls out (issue 30).

In: `tools`, `tool_choice`, `parallel_tool_calls`, `response_format` become the request's
`Constraint` (engine/constraint.py checks them, naming the field); assistant messages with
`tool_calls` and `tool` messages are read into the conversation, and every tool result must
answer a call made before it. All refused with a 400 before the engine sees the request.

Out: the reply's tool calls are read from its text with mlx-lm's own parser for the model's
format (mlx_lm/tool_parsers; mlx_lm.tokenizer_utils infers which from the chat template, and
the engine reports it as `ModelInfo.tool_parser`), returned as OpenAI `tool_calls` with
finish_reason "tool_calls", and streamed as `tool_calls` deltas (one per call, whole, once it
is closed). Call ids are derived from the prompt and reply tokens, so the same reply always
carries the same ids: an agent loop sent twice stays byte-identical, and its next step's
prompt (which quotes the ids) hits the prompt cache.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from engine.constraint import Constraint, check_tool_results, tool_message_keys
from engine.errors import RequestError
from engine.types import GenerationResult


def constraint_of(body: dict[str, Any]) -> Optional[Constraint]:
    """The request's tools and response format, checked (RequestError naming the field: the
    schema answers it as a 400)."""
    for legacy in ("functions", "function_call"):
        if body.get(legacy) is not None:
            raise RequestError(f"'{legacy}' (OpenAI's deprecated function calling) is not supported: "
                               "send 'tools' and 'tool_choice'", legacy)
    return Constraint.of(body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls"),
                         body.get("response_format"))


def message_extras(m: dict[str, Any], i: int) -> dict[str, Any]:
    """An assistant message's `tool_calls` or a tool message's `tool_call_id`, checked."""
    return tool_message_keys(m, i)


def check_results(messages: Sequence[dict[str, Any]]) -> None:
    """Every tool result answers a call made before it."""
    check_tool_results(messages)


@dataclass
class Reply:
    """A reply's text split into what the client reads as content and its tool calls."""

    content: Optional[str]
    calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI tool_calls (id, type, function)


class ToolReader:
    """Reads tool calls out of a reply's text with the model's mlx-lm parser."""

    def __init__(self, parser: str, constraint: Constraint) -> None:
        module = importlib.import_module(f"mlx_lm.tool_parsers.{parser}")
        self.start: str = module.tool_call_start
        self.end: str = module.tool_call_end
        self._parse: Callable[[str, Any], Any] = module.parse_tool_call
        self._tools = [dict(t) for t in constraint.tools]
        self._names = set(constraint.tool_names())

    def visible(self, text: str) -> str:
        """The part of a growing reply that is surely content: up to the first call's start,
        holding back a tail that may be the start of one."""
        at = text.find(self.start)
        if at >= 0:
            return text[:at]
        for k in range(min(len(self.start) - 1, len(text)), 0, -1):
            if self.start.startswith(text[-k:]):
                return text[:-k]
        return text

    def read(self, result: GenerationResult) -> Reply:
        """The whole reply: content outside the calls, and each call that parses (one that does
        not, or names a tool not offered, stays in the content as its text: nothing is lost)."""
        text = result.text
        pieces: list[str] = []
        calls: list[dict[str, Any]] = []
        pos = 0
        while (at := text.find(self.start, pos)) >= 0:
            stop = text.find(self.end, at + len(self.start))
            if stop < 0:
                break
            parsed = self._calls(text[at + len(self.start):stop])
            if parsed is None:
                pieces.append(text[pos:stop + len(self.end)])
            else:
                pieces.append(text[pos:at])
                calls += parsed
            pos = stop + len(self.end)
        tail = text[pos:]
        at = tail.find(self.start)
        if at >= 0 and result.finish_reason in ("length", "context"):
            # A call cut by max_tokens (or the context): returned as a call with its partial
            # arguments, as OpenAI does (finish_reason "length"); its markup never is content.
            pieces.append(tail[:at])
            calls += self._cut_call(tail[at + len(self.start):])
            tail, cut = "", True
        else:
            cut = False
        pieces.append(tail)
        content = "".join(pieces)
        if calls or cut:
            content = content.strip()
        for i, c in enumerate(calls):
            c["id"] = call_id(result, i)
        return Reply(content if content or not (calls or cut) else None, calls)

    def _cut_call(self, body: str) -> list[dict[str, Any]]:
        """The call whose text `body` was cut short: its name (when whole and offered) and the
        arguments as far as they came, a JSON prefix; nothing when the name itself was cut."""
        whole = self._calls(body)
        if whole is not None:  # only the end marker was cut
            return whole
        m = _CUT_CALL.match(body)
        if m is None or m.group(1) not in self._names:
            return []
        return [{"id": "", "type": "function", "function": {"name": m.group(1), "arguments": body[m.end():]}}]

    def _calls(self, body: str) -> Optional[list[dict[str, Any]]]:
        try:
            parsed = self._parse(body, self._tools)
        except Exception:  # the parsers raise what their format's reader raises (json, ast, regex)
            return None
        out = []
        for tc in parsed if isinstance(parsed, list) else [parsed]:
            if not isinstance(tc, dict) or tc.get("name") not in self._names:
                return None
            args = tc.get("arguments", {})
            out.append({"id": "", "type": "function",
                        "function": {"name": tc["name"],
                                     "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}})
        return out


# The start of a json_tools call, up to its arguments: {"name": "<name>", "arguments": <cut JSON>
_CUT_CALL = re.compile(r'\s*\{\s*"name"\s*:\s*"([A-Za-z0-9_.\-]{1,64})"\s*,\s*"arguments"\s*:\s*')


def call_id(result: GenerationResult, index: int) -> str:
    """A tool call's id: from the prompt and reply tokens, so a replayed reply has the same ids."""
    h = hashlib.sha256(json.dumps([result.prompt_ids, result.tokens, index]).encode())
    return "call_" + h.hexdigest()[:24]


def reader_for(parser: Optional[str], constraint: Optional[Constraint]) -> Optional[ToolReader]:
    """The reader of a request's replies: None when the reply is plain content (no tools, or
    tool_choice "none", or a model without a tool parser, which the engine refuses anyway)."""
    if constraint is None or not constraint.calls_parsed or not parser:
        return None
    return ToolReader(parser, constraint)


def finish_reason(reply: Reply, engine_finish: str) -> Optional[str]:
    """"tool_calls" for a reply that ended by itself with calls in it; None: the usual one."""
    return "tool_calls" if reply.calls and engine_finish == "stop" else None


def shape_message(choice: dict[str, Any], reply: Reply, engine_finish: str) -> None:
    """A non-streamed choice with its calls: content (None when it is only calls) and tool_calls."""
    choice["message"]["content"] = reply.content
    if reply.calls:
        choice["message"]["tool_calls"] = reply.calls
    choice["finish_reason"] = finish_reason(reply, engine_finish) or choice["finish_reason"]


def call_deltas(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Streamed `tool_calls` deltas: each call whole, with its index (what the openai client
    assembles)."""
    return [{"index": i, **c} for i, c in enumerate(calls)]
