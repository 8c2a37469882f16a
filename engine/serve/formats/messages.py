"""Anthropic's Messages API: `POST /v1/messages` (a query string such as `?beta=true` too) and
`POST /v1/messages/count_tokens` (issue 47).

In: `system` (a string or text blocks), `messages` with text, `tool_use` and `tool_result`
blocks (an `image` or `document` block is a 400 naming it: the engine reads no images here;
`thinking` blocks sent back are left out of the prompt), `tools` with `input_schema`,
`tool_choice` (auto, any, tool, none; `disable_parallel_tool_use`), `stop_sequences`,
`max_tokens` (required, as Anthropic), `temperature` / `top_p` / `top_k` when sent,
`output_config.format` (a JSON schema for the reply), `stream`. A user turn's tool results
become tool messages and an assistant's tool_use blocks its tool calls, so the same conversation
renders the same prompt as through chat completions or Responses, and the prompt cache serves all
three. Fields Claude Code sends that change nothing here (`metadata`, `thinking`,
`context_management`, `cache_control`, `output_config.effort`, ...) are listed in
`verbatim.ignored`; what this server cannot honour (server tools, `container`, `mcp_servers`)
is a 400 naming it. The Messages API has no seed: a request takes the server's (`serve --seed`).

Out: a `message` (content blocks text / tool_use, `stop_reason` end_turn / max_tokens /
stop_sequence / tool_use, `usage` with the prompt split as Anthropic defines it: input_tokens +
cache_read_input_tokens + cache_creation_input_tokens = the prompt's tokens: read = restored,
creation = the prompt tokens this request newly stored), or its stream: message_start, ping,
content_block_start / content_block_delta (text_delta, input_json_delta: the arguments as they
are decoded) / content_block_stop per block, message_delta (stop_reason, usage), message_stop.
Errors use Anthropic's envelope: {"type": "error", "error": {"type": ..., "message": ...}}.

Claude Code 2.1: a system block that is its billing header (`x-anthropic-billing-header: ...`,
different in every request) is left out of the prompt and listed in `verbatim.ignored`; a `system`
role inside `messages` (its environment, after the first user turn) is a system message there; a
tool with `defer_loading` stays out of the prompt (as Anthropic's API keeps it until a tool search
loads it).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Optional

from engine.bridge import StreamEvent
from engine.serve import tools
from engine.serve.generation import Generation, Outcome, sse
from engine.serve.quote import bare, quote
from engine.serve.reply import CallArguments, CallEnd, CallStart, Reply, ReplyEvent, TextDelta
from engine.serve.report import cache_split, verbatim_report
from engine.serve.schema import (
    APIError,
    Defaults,
    bad,
    boolean,
    check_fields,
    checked,
    ignored,
    integer,
    model_name,
    sampler,
    stop_strings,
    text,
    verbatim_options,
)
from engine.types import GenerationRequest

IGNORED = {"metadata": "an object", "thinking": "an object", "context_management": "an object",
           "cache_control": "an object", "service_tier": "a string", "inference_geo": "a string",
           "speed": "a string"}
FIELDS = set(IGNORED) | {"model", "messages", "system", "max_tokens", "stop_sequences", "temperature", "top_p",
                         "top_k", "stream", "tools", "tool_choice", "output_config", "seed", "verbatim"}
COUNT_FIELDS = {"model", "messages", "system", "tools", "tool_choice", "thinking", "output_config",
                "context_management", "cache_control"}
MAX_STOP_SEQUENCES = 16
# Claude Code's first system block: a header its own API reads off the prompt, whose hash changes
# with every request. Left in, it would make every prompt differ from its ~10th token: no prefix of
# any other request's could be restored (vLLM and llama.cpp leave it out too).
BILLING_HEADER = "x-anthropic-billing-header:"
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 409: "invalid_request_error", 413: "request_too_large",
                429: "rate_limit_error", 503: "overloaded_error"}


def error_body(e: APIError) -> dict[str, Any]:
    """An error in Anthropic's envelope (the same short, escaped message)."""
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(e.status, "api_error"), "message": e.message}}


@dataclass
class ParsedMessages:
    model: str
    request: GenerationRequest
    stream: bool = False
    ignored: tuple[str, ...] = ()
    id: str = ""


# -- in --------------------------------------------------------------------------------------------


def _text_blocks(v: Any, where: str, skipped: list[str]) -> str:
    """A string, or text blocks joined (their cache_control changes nothing here)."""
    if isinstance(v, str):
        return text(v, where)
    if not isinstance(v, list):
        raise bad(f"{where} must be a string or a list of text blocks", where)
    out = []
    for j, block in enumerate(v):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            kind = block.get("type") if isinstance(block, dict) else None
            raise bad(f"{where}[{j}]: {quote(kind)} blocks are not supported here (text blocks are)", f"{where}[{j}]")
        if where == "system" and block["text"].startswith(BILLING_HEADER):
            skipped.append(f"{where}[{j}]")  # a header for Anthropic's billing, not for the model
            continue
        if block.get("cache_control") is not None:
            skipped.append(f"{where}[{j}].cache_control")
        out.append(block["text"])
    return text("".join(out), where)


def _text(block: dict[str, Any], at: str, skipped: list[str]) -> str:
    if not isinstance(block.get("text"), str):
        raise bad(f"{at}.text must be a string", f"{at}.text")
    for key in ("cache_control", "citations"):
        if block.get(key) is not None:
            skipped.append(f"{at}.{key}")
    return text(block["text"], f"{at}.text")


def _user(content: list[Any], where: str, skipped: list[str]) -> list[dict[str, Any]]:
    """A user turn: its tool results (tool messages), then its text (a user message)."""
    results, texts = [], []
    for j, block in enumerate(content):
        at = f"{where}[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_result":
            ident = block.get("tool_use_id")
            if not isinstance(ident, str) or not ident:
                raise bad(f"{at}.tool_use_id must name the tool_use this result answers", f"{at}.tool_use_id")
            body = block.get("content", "")
            for key in ("is_error", "cache_control"):
                if block.get(key) is not None:
                    skipped.append(f"{at}.{key}")
            results.append({"role": "tool", "tool_call_id": ident,
                            "content": _text_blocks(body, f"{at}.content", skipped)})
        elif kind == "text":
            texts.append(_text(block, at, skipped))
        else:
            raise bad(f"{at}: {quote(kind)} blocks are not supported by this server (text and tool_result are)",
                      f"{at}.type")
    return results + ([{"role": "user", "content": "".join(texts)}] if texts or not results else [])


def _assistant(content: list[Any], where: str, skipped: list[str]) -> dict[str, Any]:
    """An assistant turn: its text and its tool_use blocks (its calls)."""
    texts, calls = [], []
    for j, block in enumerate(content):
        at = f"{where}[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_text(block, at, skipped))
        elif kind == "tool_use":
            name, ident, args = block.get("name"), block.get("id"), block.get("input", {})
            if not isinstance(name, str) or not name or not isinstance(ident, str) or not ident:
                raise bad(f"{at} must have an 'id' and a 'name'", at)
            if not isinstance(args, dict):
                raise bad(f"{at}.input must be an object", f"{at}.input")
            calls.append({"id": ident, "type": "function",
                          "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}})
        elif kind in ("thinking", "redacted_thinking"):
            skipped.append(at)  # a thinking model's notes: not part of the prompt here
        else:
            raise bad(f"{at}: {quote(kind)} blocks are not supported by this server (text and tool_use are)",
                      f"{at}.type")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        message["tool_calls"] = calls
    return message


def conversation(body: dict[str, Any], skipped: list[str]) -> list[dict[str, Any]]:
    """`system` and `messages` as the engine's messages."""
    out: list[dict[str, Any]] = []
    if body.get("system") is not None:
        system = _text_blocks(body["system"], "system", skipped)
        if system:
            out.append({"role": "system", "content": system})
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("'messages' must be a non-empty list of {role, content} objects", "messages")
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            raise bad(f"{where} must be an object with role 'user' or 'assistant'", f"{where}.role")
        content = m.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            raise bad(f"{where}.content must be a string or a list of blocks", f"{where}.content")
        if m["role"] == "system":  # Claude Code 2.1 sends its environment so, after the first user turn
            out.append({"role": "system", "content": _text_blocks(blocks, f"{where}.content", skipped)})
        elif m["role"] == "user":
            out += _user(blocks, f"{where}.content", skipped)
        else:
            out.append(_assistant(blocks, f"{where}.content", skipped))
    checked(tools.check_results, out)
    return out


def _tools(body: dict[str, Any], skipped: list[str]) -> Optional[list[dict[str, Any]]]:
    v = body.get("tools")
    if v is None:
        return None
    if not isinstance(v, list):
        raise bad("'tools' must be a list of tools", "tools")
    out = []
    for i, t in enumerate(v):
        if not isinstance(t, dict) or t.get("type", "custom") != "custom" or "input_schema" not in t:
            kind = t.get("type") if isinstance(t, dict) else None
            raise bad(f"tools[{i}]: {quote(kind)} tools are not supported by this server (client tools with an "
                      "input_schema are)", f"tools[{i}]")
        unknown = sorted(k for k in t if k not in ("type", "name", "description", "input_schema", "cache_control",
                                                    "strict", "defer_loading") and t[k] is not None)
        if unknown:
            raise bad(f"tools[{i}].{bare(unknown[0])} is not supported", f"tools[{i}].{bare(unknown[0])}")
        if t.get("cache_control") is not None:
            skipped.append(f"tools[{i}].cache_control")
        if t.get("defer_loading") is True:  # not in the prompt until a tool search loads it (Anthropic's rule)
            continue
        fn = {"name": t.get("name"), "parameters": t.get("input_schema")}
        for key in ("description", "strict"):
            if t.get(key) is not None:
                fn[key] = t[key]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(body: dict[str, Any]) -> tuple[Any, Optional[bool]]:
    """tool_choice as chat completions' (and parallel_tool_calls)."""
    v = body.get("tool_choice")
    if v is None:
        return None, None
    if not isinstance(v, dict) or v.get("type") not in ("auto", "any", "tool", "none"):
        raise bad("'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}", "tool_choice")
    one = v.get("disable_parallel_tool_use")
    if one is not None and not isinstance(one, bool):
        raise bad("'tool_choice.disable_parallel_tool_use' must be a boolean", "tool_choice.disable_parallel_tool_use")
    parallel = None if one is None or v["type"] == "none" else not one
    if v["type"] == "tool":
        return {"type": "function", "function": {"name": v.get("name")}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[v["type"]], parallel


def _output_config(body: dict[str, Any], defaults: Defaults,
                   skipped: list[str]) -> tuple[Optional[dict[str, Any]], tuple[tuple[str, str], ...]]:
    """`output_config.format` as a response format; `output_config.effort` to the chat template
    where it reads `reasoning_effort` (gpt-oss), else listed as ignored."""
    cfg = body.get("output_config")
    if cfg is None:
        return None, ()
    if not isinstance(cfg, dict):
        raise bad("'output_config' must be an object", "output_config")
    unknown = sorted(k for k in cfg if k not in ("effort", "format") and cfg[k] is not None)
    if unknown:
        raise bad(f"'output_config.{bare(unknown[0])}' is not supported", f"output_config.{bare(unknown[0])}")
    options, more = defaults.template_option("reasoning_effort", cfg.get("effort"), "output_config.effort")
    skipped += more
    return _json_format(cfg.get("format")), options


def _json_format(fmt: Any) -> Optional[dict[str, Any]]:
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise bad("'output_config.format' must be {\"type\": \"json_schema\", \"schema\": {...}}",
                  "output_config.format")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"], "strict": True}}


def _constraint(body: dict[str, Any], skipped: list[str], fmt: Optional[dict[str, Any]]) -> Any:
    choice, parallel = _tool_choice(body)
    return checked(tools.constraint_of, {"tools": _tools(body, skipped), "tool_choice": choice,
                                         "parallel_tool_calls": parallel, "response_format": fmt})


def parse(body: Any, defaults: Defaults = Defaults()) -> ParsedMessages:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    check_fields(body, FIELDS)
    skipped = ignored(body, IGNORED)
    limit = integer(body, "max_tokens", None, 1, 1 << 31)
    if limit is None:
        raise bad("'max_tokens' is required", "max_tokens")
    messages = conversation(body, skipped)
    fmt, options = _output_config(body, defaults, skipped)
    constraint = _constraint(body, skipped, fmt)
    settings, _, _ = sampler(body, defaults, max_temperature=1.0, max_tokens_given=limit)
    req = GenerationRequest(messages, settings, stop=stop_strings(body, "stop_sequences", MAX_STOP_SEQUENCES),
                            constraint=constraint, template_options=options,
                            **{"mode": defaults.mode, **verbatim_options(body)})
    ident = "msg_" + hashlib.sha256(repr(req).encode()).hexdigest()[:48]
    return ParsedMessages(model_name(body), req, boolean(body, "stream"), tuple(skipped), ident)


def parse_count(body: Any, defaults: Defaults = Defaults()) -> tuple[str, GenerationRequest]:
    """count_tokens: the same conversation, tools and template options, nothing generated."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    check_fields(body, COUNT_FIELDS)
    skipped: list[str] = []
    messages = conversation(body, skipped)
    fmt, options = _output_config(body, defaults, skipped)
    return model_name(body), GenerationRequest(messages, constraint=_constraint(body, skipped, fmt),
                                               template_options=options)


# -- out -------------------------------------------------------------------------------------------


def usage(outcome: Outcome) -> dict[str, Any]:
    read, created, rest = cache_split(outcome.result)
    return {"input_tokens": rest, "cache_creation_input_tokens": created, "cache_read_input_tokens": read,
            "output_tokens": len(outcome.result.tokens)}


def stop_reason(reply: Reply, stop_string: Optional[str]) -> str:
    if reply.ended_with_calls:
        return "tool_use"
    if reply.cut:
        return "max_tokens"
    return "stop_sequence" if stop_string is not None else "end_turn"


class Blocks:
    """The content blocks of a reply, built from its events: a text block for each stretch of
    text, a tool_use block for each call, in order."""

    def __init__(self) -> None:
        self.blocks: list[dict[str, Any]] = []
        self._args: dict[int, str] = {}
        self._open: Optional[int] = None  # the block still open (text, or the call being decoded)
        self._calls: dict[int, int] = {}  # call index -> block index

    def events(self, events: list[ReplyEvent]) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        for e in events:
            if isinstance(e, TextDelta):
                if self._open is None or self.blocks[self._open]["type"] != "text":
                    out += self._close()
                    self._open = len(self.blocks)
                    self.blocks.append({"type": "text", "text": ""})
                    out.append(("content_block_start", {"type": "content_block_start", "index": self._open,
                                                        "content_block": {"type": "text", "text": ""}}))
                self.blocks[self._open]["text"] += e.text
                out.append(("content_block_delta", {"type": "content_block_delta", "index": self._open,
                                                    "delta": {"type": "text_delta", "text": e.text}}))
            elif isinstance(e, CallStart):
                out += self._close()
                self._open = self._calls[e.index] = len(self.blocks)
                self.blocks.append({"type": "tool_use", "id": "toolu_" + e.id, "name": e.name, "input": {}})
                out.append(("content_block_start", {"type": "content_block_start", "index": self._open,
                                                    "content_block": dict(self.blocks[-1])}))
            elif isinstance(e, CallArguments):
                index = self._calls[e.index]
                out.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                                    "delta": {"type": "input_json_delta", "partial_json": e.fragment}}))
            elif isinstance(e, CallEnd):
                block = self.blocks[self._calls[e.index]]
                try:
                    block["input"] = json.loads(e.arguments)
                except ValueError:  # cut by max_tokens: its input_json_delta events carried what came
                    block["input"] = {}
                out += self._close()
        return out

    def _close(self) -> list[tuple[str, dict[str, Any]]]:
        if self._open is None:
            return []
        index, self._open = self._open, None
        return [("content_block_stop", {"type": "content_block_stop", "index": index})]

    def finish(self) -> list[tuple[str, dict[str, Any]]]:
        return self._close()


def message(p: ParsedMessages, model: str, content: list[dict[str, Any]], stop: Optional[str],
            stop_sequence: Optional[str], use: dict[str, Any]) -> dict[str, Any]:
    return {"id": p.id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop, "stop_sequence": stop_sequence, "usage": use}


def final(p: ParsedMessages, model: str, outcome: Outcome) -> dict[str, Any]:
    blocks = Blocks()
    blocks.events(outcome.events)
    out = message(p, model, blocks.blocks, stop_reason(outcome.reply, outcome.stop_string), outcome.stop_string,
                  usage(outcome))
    out["verbatim"] = verbatim_report(outcome.result, outcome.queue, p.ignored, outcome.receipt)
    return out


class MessageStream:
    def __init__(self, p: ParsedMessages, model: str) -> None:
        self.p, self.model = p, model
        self.blocks = Blocks()

    @staticmethod
    def _sse(events: list[tuple[str, dict[str, Any]]]) -> bytes:
        return b"".join(sse(e, name) for name, e in events)

    def start(self, gen: Generation) -> bytes:
        head = message(self.p, self.model, [], None, None,
                       {"input_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                        "output_tokens": 0})
        return self._sse([("message_start", {"type": "message_start", "message": head}),
                          ("ping", {"type": "ping"})])

    def batch(self, gen: Generation, events: list[StreamEvent]) -> bytes:
        return self._sse(self.blocks.events(gen.feed_all(events)))

    def end(self, gen: Generation, last: list[ReplyEvent], outcome: Outcome) -> bytes:
        out = self.blocks.events(last) + self.blocks.finish()
        delta = {"type": "message_delta",
                 "delta": {"stop_reason": stop_reason(outcome.reply, outcome.stop_string),
                           "stop_sequence": outcome.stop_string},
                 "usage": usage(outcome),
                 "verbatim": verbatim_report(outcome.result, outcome.queue, self.p.ignored, outcome.receipt)}
        out += [("message_delta", delta), ("message_stop", {"type": "message_stop"})]
        return self._sse(out)

    def error(self, e: APIError) -> bytes:
        return sse(error_body(e), "error")
