"""Tools and output formats: what an agent asks besides the conversation (issue 30).

A `Constraint` holds the tools a request offers (OpenAI function definitions, rendered into the
prompt by the model's own chat template), `tool_choice`, `parallel_tool_calls` and the
`response_format`. Where the reply's shape is forced (`tool_choice` "required" or a named
function, a JSON `response_format`) the engine decodes under a grammar built from it
(engine/generate/constraints.py); the mask depends only on the tokens so far, so replies stay
deterministic as long as the constraint is part of the request's identity: receipts record it
(`to_dict`) and "identical to previous" compares it (`identity`).

Also the checks of tool calls and tool results inside the messages (`tool_message_keys`,
`check_tool_results`). Plain data and plain checks: no MLX, no tokenizer. Errors are
`RequestError`s naming the request field at fault (`param`), which the server answers as 400.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from engine.errors import RequestError

TOOL_CHOICES = ("none", "auto", "required", "function")
MAX_TOOLS = 128
MAX_FIELD_BYTES = 1 << 20  # `tools` or `response_format`, as JSON
_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")  # OpenAI's function names (and dots, which some use)


@dataclass(frozen=True)
class Constraint:
    """Tools offered and the shape forced on the reply. Build with `Constraint.of` (checks)."""

    tools: tuple[dict[str, Any], ...] = ()  # {"type": "function", "function": {name, description?, parameters?}}
    tool_choice: str = "auto"  # one of TOOL_CHOICES ("function": `function` must be called)
    function: Optional[str] = None  # the function tool_choice names
    parallel_tool_calls: bool = True  # "required": one call or several
    # {"type": "json_object"} or {"type": "json_schema", "name": str, "schema": {...}, "strict": bool}
    response_format: Optional[dict[str, Any]] = None

    @property
    def forced_tool(self) -> bool:
        """The reply must be tool calls (and nothing else)."""
        return bool(self.tools) and self.tool_choice in ("required", "function")

    @property
    def decoding(self) -> bool:
        """Decoding runs under a grammar (else the constraint only shapes the prompt and the answer)."""
        return self.forced_tool or self.response_format is not None

    @property
    def failure_param(self) -> str:
        """The field a grammar failure while decoding names."""
        return "response_format" if self.response_format is not None and not self.forced_tool else "tools"

    def digest(self) -> str:
        """A short digest of `identity()`: what keys that only compare constraints hold."""
        return hashlib.sha256(self.identity().encode()).hexdigest()

    @property
    def calls_parsed(self) -> bool:
        """Tool calls in the reply are read out of its text (tool_choice other than "none")."""
        return bool(self.tools) and self.tool_choice != "none"

    def tool_names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    def tool(self, name: str) -> Optional[dict[str, Any]]:
        return next((t for t in self.tools if t["function"]["name"] == name), None)

    def to_dict(self) -> dict[str, Any]:
        """JSON for receipts and reports (what a replay needs to rebuild the same grammar)."""
        return {"tools": [dict(t) for t in self.tools], "tool_choice": self.tool_choice, "function": self.function,
                "parallel_tool_calls": self.parallel_tool_calls, "response_format": self.response_format}

    def request_fields(self) -> dict[str, Any]:
        """The OpenAI request fields that ask for this constraint (what engine/remote.py sends)."""
        out: dict[str, Any] = {}
        if self.tools:
            out["tools"] = [dict(t) for t in self.tools]
            out["tool_choice"] = ({"type": "function", "function": {"name": self.function}}
                                  if self.tool_choice == "function" else self.tool_choice)
            out["parallel_tool_calls"] = self.parallel_tool_calls
        fmt = self.response_format
        if fmt is not None:
            out["response_format"] = fmt if fmt["type"] == "json_object" else {
                "type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}
        return out

    def identity(self) -> str:
        """A canonical string of everything that shapes the reply: equal iff the constraints are."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_dict(cls, d: Any) -> "Constraint":
        """Rebuild from `to_dict()` (a receipt's); RequestError if malformed."""
        if not isinstance(d, dict):
            raise RequestError("a constraint must be an object", "constraint")
        choice: Any = d.get("tool_choice", "auto")
        if choice == "function":
            choice = {"type": "function", "function": {"name": d.get("function")}}
        fmt = d.get("response_format")
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and "json_schema" not in fmt:
            fmt = {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}
        tools = d.get("tools") or None
        made = cls.of(tools, choice if tools else None, d.get("parallel_tool_calls") if tools else None, fmt)
        if made is None:
            raise RequestError("the constraint is empty", "constraint")
        return made

    @classmethod
    def of(cls, tools: Any = None, tool_choice: Any = None, parallel_tool_calls: Any = None,
           response_format: Any = None) -> Optional["Constraint"]:
        """The constraint of OpenAI's request fields (None: none of them asks for anything)."""
        _check_size(tools, "tools")
        _check_size(response_format, "response_format")
        tool_list = _tools(tools)
        choice, function = _tool_choice(tool_choice, tool_list)
        if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
            raise RequestError("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
        if parallel_tool_calls is not None and not tool_list:
            raise RequestError("'parallel_tool_calls' needs 'tools'", "parallel_tool_calls")
        fmt = _response_format(response_format)
        # A forced tool_choice with a response_format (as OpenAI takes it): this reply is the call,
        # the format shapes the content of later turns (engine/generate/constraints.py).
        if not tool_list and fmt is None:
            return None
        return cls(tool_list, choice if tool_list else "none", function,
                   True if parallel_tool_calls is None else parallel_tool_calls, fmt)


def _check_size(value: Any, param: str) -> None:
    """A tool list or response format past MAX_FIELD_BYTES (JSON) is refused: its grammar, cache
    entries and receipts would all carry it."""
    if value is None:
        return
    try:
        n = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
    except (TypeError, ValueError, RecursionError):
        return  # not JSON data: the field's own check says what is wrong
    if n > MAX_FIELD_BYTES:
        raise RequestError(f"'{param}' is {n} bytes of JSON; at most {MAX_FIELD_BYTES} (1 MiB) is accepted", param)


def _tools(tools: Any) -> tuple[dict[str, Any], ...]:
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise RequestError("'tools' must be a list of {type: function, function: {...}} objects", "tools")
    if len(tools) > MAX_TOOLS:
        raise RequestError(f"'tools' takes at most {MAX_TOOLS} tools", "tools")
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise RequestError(f"{where} must be {{\"type\": \"function\", \"function\": {{...}}}}", where)
        f = t["function"]
        unknown = sorted(k for k in f if k not in ("name", "description", "parameters", "strict"))
        if unknown:
            raise RequestError(f"{where}.function.{unknown[0]} is not a function field", f"{where}.function")
        name = f.get("name")
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise RequestError(f"{where}.function.name must be 1 to 64 letters, digits, '_', '-' or '.'",
                               f"{where}.function.name")
        if name in seen:
            raise RequestError(f"{where}.function.name {name!r} is offered twice", f"{where}.function.name")
        seen.add(name)
        if f.get("description") is not None and not isinstance(f["description"], str):
            raise RequestError(f"{where}.function.description must be a string", f"{where}.function.description")
        params = f.get("parameters")
        if params is not None and (not isinstance(params, dict) or params.get("type", "object") != "object"):
            raise RequestError(f"{where}.function.parameters must be a JSON Schema of an object",
                               f"{where}.function.parameters")
        if f.get("strict") is not None and not isinstance(f["strict"], bool):
            raise RequestError(f"{where}.function.strict must be a boolean", f"{where}.function.strict")
        fn: dict[str, Any] = {"name": name}
        for key in ("description", "parameters", "strict"):
            if f.get(key) is not None:
                fn[key] = f[key]
        out.append({"type": "function", "function": fn})
    return tuple(out)


def _tool_choice(choice: Any, tools: Sequence[dict[str, Any]]) -> tuple[str, Optional[str]]:
    if choice is None:
        return ("auto" if tools else "none"), None
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise RequestError("'tool_choice' must be 'none', 'auto', 'required' or "
                               "{\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice")
        if choice != "none" and not tools:
            raise RequestError(f"'tool_choice' {choice!r} needs 'tools'", "tool_choice")
        return choice, None
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise RequestError("'tool_choice' must name a function as {\"type\": \"function\", \"function\": "
                           "{\"name\": ...}}", "tool_choice")
    if name not in [t["function"]["name"] for t in tools]:
        offered = ", ".join(t["function"]["name"] for t in tools) or "none"
        raise RequestError(f"'tool_choice' names {name!r}, which is not among the tools offered ({offered})",
                           "tool_choice")
    return "function", name


def _response_format(fmt: Any) -> Optional[dict[str, Any]]:
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise RequestError("'response_format' must be {\"type\": \"text\" | \"json_object\" | \"json_schema\"}",
                           "response_format")
    if fmt["type"] == "text":
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict):
        raise RequestError("'response_format.json_schema' must be an object with a 'schema'",
                           "response_format.json_schema")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise RequestError("'response_format.json_schema.schema' must be a JSON Schema object",
                           "response_format.json_schema.schema")
    name = spec.get("name", "response")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise RequestError("'response_format.json_schema.name' must be 1 to 64 letters, digits, '_' or '-'",
                           "response_format.json_schema.name")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise RequestError("'response_format.json_schema.strict' must be a boolean",
                           "response_format.json_schema.strict")
    return {"type": "json_schema", "name": name, "schema": schema, "strict": bool(strict)}


# -- tool calls and results inside the messages -----------------------------------------------


def tool_message_keys(m: dict[str, Any], i: int) -> dict[str, Any]:
    """The tool keys message `i` keeps beside role and content, checked: an assistant's
    `tool_calls` (arguments a JSON string, as OpenAI sends them) and a tool message's
    `tool_call_id`. Nothing for the other roles."""
    role = m.get("role")
    if role == "tool":
        call_id = m.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise RequestError(f"messages[{i}].tool_call_id must name the tool call this message answers",
                               f"messages[{i}].tool_call_id")
        return {"tool_call_id": call_id}
    if "tool_call_id" in m:
        raise RequestError(f"messages[{i}].tool_call_id: only tool messages answer a tool call",
                           f"messages[{i}].tool_call_id")
    calls = m.get("tool_calls")
    if calls is None or role != "assistant":
        if calls is not None:
            raise RequestError(f"messages[{i}].tool_calls: only assistant messages make tool calls",
                               f"messages[{i}].tool_calls")
        return {}
    if not isinstance(calls, list) or not calls:
        raise RequestError(f"messages[{i}].tool_calls must be a non-empty list", f"messages[{i}].tool_calls")
    out = []
    for j, c in enumerate(calls):
        where = f"messages[{i}].tool_calls[{j}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(c, dict) or c.get("type", "function") != "function" or not isinstance(fn, dict):
            raise RequestError(f"{where} must be {{id, type: function, function: {{name, arguments}}}}", where)
        if not isinstance(c.get("id"), str) or not c["id"]:
            raise RequestError(f"{where}.id must be a non-empty string", f"{where}.id")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RequestError(f"{where}.function.name must be a non-empty string", f"{where}.function.name")
        args = fn.get("arguments", "{}")
        if not isinstance(args, str):
            raise RequestError(f"{where}.function.arguments must be a JSON string", f"{where}.function.arguments")
        # Not checked as JSON: a call cut by max_tokens comes back with its partial arguments
        # (finish_reason "length", as OpenAI does), and agent loops send it back as it came.
        out.append({"id": c["id"], "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return {"tool_calls": out}


def check_tool_results(messages: Sequence[dict[str, Any]]) -> None:
    """Every tool message answers a call of the assistant message before it (a run of tool
    messages follows the assistant message that made the calls), once."""
    open_calls: set[str] = set()
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "assistant":
            open_calls = {c["id"] for c in m.get("tool_calls") or ()}
        elif role == "tool":
            call_id = m.get("tool_call_id")
            if call_id not in open_calls:
                raise RequestError(f"messages[{i}] is a tool result for {call_id!r}, but no assistant message "
                                   "before it made that call (or it was answered already)",
                                   f"messages[{i}].tool_call_id")
            open_calls.discard(call_id)
        else:
            open_calls = set()


def template_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as chat templates read them: tool-call arguments as objects, not JSON
    strings (as transformers and mlx_lm.server hand them over); arguments that are not JSON
    (a call cut by max_tokens) stay the string they are."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = {**m, "tool_calls": [{**c, "function": {**c["function"],
                                                        "arguments": _arguments(c["function"]["arguments"])}}
                                     for c in m["tool_calls"]]}
        out.append(dict(m))
    return out


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text
