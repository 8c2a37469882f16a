"""OpenAI's Responses API: `POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}` (issue 47).

In: `input` (a string, or items: messages with `input_text` / `output_text` parts, `function_call`,
`function_call_output`; `reasoning` items are accepted and left out of the prompt), `instructions`
(a system message first; not carried over by `previous_response_id`, as OpenAI says), function
`tools` (the flat form), `tool_choice`, `parallel_tool_calls`, `text.format` (json_schema,
json_object), `max_output_tokens`, `temperature`, `top_p`, `truncation` ("auto": the oldest turns
are left out when the context is full), `stream`, `store`, `previous_response_id`. The same
conversation renders the same messages as chat completions (an assistant's text and its calls are
one message), so the prompt cache serves both. Fields harnesses send that change nothing here
(`reasoning`, `include`, `prompt_cache_key`, ..., and a `web_search` tool: Codex CLI offers one by
default) are listed in `verbatim.ignored`; a `namespace`'s function tools are offered by their
qualified name; another hosted tool (file search, ...) or another field this server cannot honour is
a 400 naming it.

Out: a `response` object (`status` completed, or incomplete with `incomplete_details` when cut by
max_output_tokens; `usage.input_tokens_details.cached_tokens` = tokens restored from the cache),
or its stream: response.created, response.in_progress, then per output item
response.output_item.added, (a message) response.content_part.added, response.output_text.delta
... .done, response.content_part.done, (a call) response.function_call_arguments.delta ... .done,
response.output_item.done; then response.completed (or response.incomplete); an error after the
stream began is response.failed. Ids derive from the request (the same request, the same ids).

`ResponseStore`: what `previous_response_id` and GET read, bounded per API-key namespace (the
least recently used go first; an unknown or evicted id is a 404 naming it); `store: false` keeps
nothing.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from engine.bridge import StreamEvent
from engine.serve.files import FileBytes
from engine.serve import files, tools
from engine.serve.generation import Generation, Outcome, sse
from engine.serve.quote import bare, quote
from engine.serve.reply import CallArguments, CallEnd, CallStart, ReplyEvent, TextDelta
from engine.serve.report import verbatim_report
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
    text,
    verbatim_options,
)
from engine.types import GenerationRequest, GenerationResult

IGNORED = {"metadata": "an object of strings", "user": "a string", "include": "a list",
           "prompt_cache_key": "a string", "prompt_cache_retention": "a string", "safety_identifier": "a string",
           "service_tier": "a string", "client_metadata": "an object", "stream_options": "an object"}
FIELDS = set(IGNORED) | {"reasoning", "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text",
                         "max_output_tokens", "temperature", "top_p", "truncation", "stream", "store",
                         "previous_response_id", "background", "max_tool_calls", "seed", "top_k", "min_p", "repetition_penalty",
                         "verbatim"}
STORED_PER_NAMESPACE = 256  # responses kept for previous_response_id / GET, per API-key namespace
STORED_BYTES = 64 << 20  # and at most about this many bytes of their conversations


@dataclass
class ParsedResponse:
    """One validated Responses request."""

    model: str
    request: GenerationRequest  # its messages: instructions + the conversation (history + input)
    history: list[dict[str, Any]]  # the conversation without the instructions (what the store keeps)
    body: dict[str, Any]  # as sent (echoed: tools, tool_choice, text, ...)
    stream: bool = False
    store: bool = True
    previous: Optional[str] = None
    ignored: tuple[str, ...] = ()
    files: tuple[FileBytes, ...] = ()  # input_file parts not yet read (the shared path reads them as documents)
    created: float = field(default_factory=lambda: float(int(time.time())))
    id: str = ""


# -- in --------------------------------------------------------------------------------------------


def _parts(content: Any, where: str, documents: list[FileBytes]) -> str:
    """A message's content: a string, or text parts (input_text / output_text / refusal) joined,
    `input_file` parts read as documents."""
    if isinstance(content, str):
        return text(content, where)
    if not isinstance(content, list):
        raise bad(f"{where} must be a string or a list of content parts", where)
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            out.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            out.append(part["refusal"])
        elif kind == "input_file":
            f = {k: part[k] for k in ("filename", "file_data", "file_id") if part.get(k) is not None}
            checked(files.collect, documents, checked(files.file_part, {"file": f}, f"{where}[{j}]"), where)
        else:
            raise bad(f"{where}[{j}]: {quote(kind)} parts are not supported (text and input_file are)", f"{where}[{j}]")
    return text("".join(out), where)


def _arguments(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise bad(f"{where}.arguments must be a JSON string", f"{where}.arguments")
    return v


def input_messages(items: Any, documents: list[FileBytes]) -> tuple[list[dict[str, Any]], list[str]]:
    """The conversation `input` holds, as the engine's messages, and the items left out (reasoning)."""
    if isinstance(items, str):
        return [{"role": "user", "content": text(items, "input")}], []
    if not isinstance(items, list) or not items:
        raise bad("'input' must be a string or a non-empty list of items", "input")
    out: list[dict[str, Any]] = []
    skipped: list[str] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad(f"{where} must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = {"developer": "system"}.get(item.get("role"), item.get("role"))
            if role not in ("system", "user", "assistant"):
                raise bad(f"{where}.role must be user, assistant, system or developer; got {quote(item.get('role'))}",
                          f"{where}.role")
            out.append({"role": role, "content": _parts(item.get("content"), f"{where}.content", documents)})
        elif kind == "function_call":
            name, call_id = item.get("name"), item.get("call_id")
            if not isinstance(name, str) or not name or not isinstance(call_id, str) or not call_id:
                raise bad(f"{where} must name the function ('name') and the call ('call_id')", where)
            if isinstance(item.get("namespace"), str) and item["namespace"]:
                name = f"{item['namespace']}.{name}"  # a namespace's tool, as _tools offered it
            call = {"id": call_id, "type": "function",
                    "function": {"name": name, "arguments": _arguments(item.get("arguments", "{}"), where)}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":  # a reply's text and its calls: one message
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str) or not call_id:
                raise bad(f"{where}.call_id must name the call this output answers", f"{where}.call_id")
            out.append({"role": "tool", "tool_call_id": call_id,
                        "content": _parts(output, f"{where}.output", documents)})
        elif kind == "reasoning":
            skipped.append(where)  # a reasoning model's own notes: not part of the prompt here
        else:
            raise bad(f"{where}: {quote(kind)} items are not supported (message, function_call, "
                      "function_call_output and reasoning are)", f"{where}.type")
    return out, skipped


def _tools(body: dict[str, Any], skipped: list[str]) -> Optional[list[dict[str, Any]]]:
    """The flat function tools, in chat completions' shape (tools.py checks them). A `namespace`'s
    function tools are offered as `namespace.name` (a call to one comes back with its `namespace`,
    as OpenAI's does); `web_search` (Codex CLI offers it by default) is listed in skipped: this
    server searches nothing, so the model is offered no search."""
    v = body.get("tools")
    if v is None:
        return None
    if not isinstance(v, list):
        raise bad("'tools' must be a list of function tools", "tools")
    out = []
    for i, t in enumerate(v):
        kind = t.get("type") if isinstance(t, dict) else None
        if kind == "web_search":
            skipped.append(f"tools[{i}]")
            continue
        if kind == "namespace" and isinstance(t.get("name"), str) and isinstance(t.get("tools"), list):
            out += [_function(f, f"tools[{i}].tools[{j}]", t["name"] + ".") for j, f in enumerate(t["tools"])]
            continue
        out.append(_function(t, f"tools[{i}]"))
    return out or None  # none left (only a web search): no tools, so tool_choice "auto" asks nothing


def _function(t: Any, where: str, prefix: str = "") -> dict[str, Any]:
    if not isinstance(t, dict) or t.get("type") != "function":
        kind = t.get("type") if isinstance(t, dict) else None
        raise bad(f"{where}: {quote(kind)} tools are not supported by this server (function tools are)",
                  f"{where}.type")
    unknown = sorted(k for k in t if k not in ("type", "name", "description", "parameters", "strict")
                     and t[k] is not None)
    if unknown:
        raise bad(f"{where}.{bare(unknown[0])} is not supported", f"{where}.{bare(unknown[0])}")
    fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None}
    if prefix and isinstance(fn.get("name"), str):
        fn["name"] = prefix + fn["name"]
    return {"type": "function", "function": fn}


def _namespaced(name: str, body: dict[str, Any]) -> dict[str, str]:
    """A call's `name` (and `namespace`, for a tool of a namespace the request offered)."""
    for t in body.get("tools") or ():
        if isinstance(t, dict) and t.get("type") == "namespace" and isinstance(t.get("name"), str) \
                and name.startswith(t["name"] + "."):
            return {"name": name[len(t["name"]) + 1:], "namespace": t["name"]}
    return {"name": name}


def _tool_choice(body: dict[str, Any]) -> Any:
    v = body.get("tool_choice")
    if isinstance(v, dict) and v.get("type") == "function":
        return {"type": "function", "function": {"name": v.get("name")}}
    if v is not None and not isinstance(v, str):
        raise bad("'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", \"name\": ...}",
                  "tool_choice")
    return v


def _format(body: dict[str, Any]) -> tuple[Optional[dict[str, Any]], list[str]]:
    """`text.format` as chat completions' response_format; `text.verbosity` changes nothing."""
    t = body.get("text")
    if t is None:
        return None, []
    if not isinstance(t, dict):
        raise bad("'text' must be an object", "text")
    unknown = sorted(k for k in t if k not in ("format", "verbosity") and t[k] is not None)
    if unknown:
        raise bad(f"'text.{bare(unknown[0])}' is not supported", f"text.{bare(unknown[0])}")
    skipped = ignored(t, {"verbosity": "a string"}, "text.")
    fmt = t.get("format")
    if fmt is None:
        return None, skipped
    if not isinstance(fmt, dict):
        raise bad("'text.format' must be an object", "text.format")
    if fmt.get("type") == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict") if fmt.get(k) is not None}
        return {"type": "json_schema", "json_schema": spec}, skipped
    return fmt, skipped


def _reasoning(body: dict[str, Any], defaults: Defaults, skipped: list[str]) -> tuple[tuple[str, str], ...]:
    """`reasoning.effort` to the chat template where it reads `reasoning_effort` (gpt-oss); the
    rest of `reasoning` (a summary wanted) changes nothing here."""
    r = body.get("reasoning")
    if r is None:
        return ()
    if not isinstance(r, dict):
        raise bad("'reasoning' must be an object", "reasoning")
    options, more = defaults.template_option("reasoning_effort", r.get("effort"), "reasoning.effort")
    skipped += more + [f"reasoning.{k}" for k in sorted(r) if k != "effort" and r[k] is not None]
    return options


def parse(body: Any, defaults: Defaults = Defaults()) -> ParsedResponse:
    """A Responses request, its conversation not yet joined to a previous response's (`resolve`)."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    check_fields(body, FIELDS)
    skipped = ignored(body, IGNORED)
    if integer(body, "max_tool_calls", None, 1, 1 << 31) is not None:
        skipped.append("max_tool_calls")  # a limit on hosted tools' calls: there are none here
    if boolean(body, "background"):
        raise bad("'background' responses are not supported by this server", "background")
    documents: list[FileBytes] = []
    if body.get("input") is None:
        raise bad("'input' is required", "input")
    messages, left_out = input_messages(body["input"], documents)
    skipped += left_out
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad("'instructions' must be a string", "instructions")
    fmt, more = _format(body)
    skipped += more
    truncation = body.get("truncation")
    if truncation not in (None, "auto", "disabled"):
        raise bad("'truncation' must be 'auto' or 'disabled'", "truncation")
    limit = integer(body, "max_output_tokens", None, 1, 1 << 31)
    settings, _, max_given = sampler(body, defaults, max_tokens_given=limit)
    offered = _tools(body, skipped)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not offered:  # Responses clients send it with no tools: it changes nothing
        skipped += ignored(body, {"parallel_tool_calls": "a boolean"})
        parallel = None
    constraint = checked(tools.constraint_of, {"tools": offered, "tool_choice": _tool_choice(body),
                                               "parallel_tool_calls": parallel, "response_format": fmt})
    prev = body.get("previous_response_id")
    if prev is not None and (not isinstance(prev, str) or not prev):
        raise bad("'previous_response_id' must be a response id", "previous_response_id")
    options = _reasoning(body, defaults, skipped)
    system = [{"role": "system", "content": text(instructions, "instructions")}] if instructions else []
    req = GenerationRequest(system + messages, settings, constraint=constraint, max_tokens_fit=not max_given,
                            template_options=options,
                            context_policy="truncate" if truncation == "auto" else "refuse",
                            **{"mode": defaults.mode, **verbatim_options(body)})
    return ParsedResponse(model_name(body), req, messages, body, boolean(body, "stream"),
                          boolean(body, "store", True), prev, tuple(skipped), tuple(documents))


def resolve(p: ParsedResponse, previous: Optional["Stored"]) -> ParsedResponse:
    """The request with the previous response's conversation before its input, checked whole
    (every tool result answers a call made before it), and the previous response's files before
    its own (the documents stay attached for the whole chain, as the conversation does); its id,
    derived from the request and its files."""
    history = [*previous.conversation, *p.history] if previous is not None else p.history
    documents: list[FileBytes] = []
    for f in [*(previous.files if previous is not None else ()), *p.files]:
        checked(files.collect, documents, f, "input")
    system = p.request.messages[: len(p.request.messages) - len(p.history)]
    checked(tools.check_results, history)
    request = replace(p.request, messages=[*system, *history])
    ident = hashlib.sha256(json.dumps([repr(request), p.previous, [f.digest for f in documents]]).encode()
                           ).hexdigest()[:48]
    return replace(p, request=request, history=history, files=tuple(documents), id="resp_" + ident)


# -- the store -------------------------------------------------------------------------------------


@dataclass
class Stored:
    response: dict[str, Any]  # the response object, as answered
    conversation: list[dict[str, Any]]  # its history and its reply, as the engine's messages
    size: int
    files: tuple[FileBytes, ...] = ()  # the files its chain attached (a later response keeps them)


class ResponseStore:
    """Responses kept for `previous_response_id` and GET, per API-key namespace, least recently
    used out first (at most STORED_PER_NAMESPACE, about STORED_BYTES each namespace)."""

    def __init__(self, limit: int = STORED_PER_NAMESPACE, max_bytes: int = STORED_BYTES) -> None:
        self.limit, self.max_bytes = limit, max_bytes
        self._by_ns: dict[Optional[str], OrderedDict[str, Stored]] = {}

    def put(self, namespace: Optional[str], response: dict[str, Any], conversation: list[dict[str, Any]],
            attached: tuple[FileBytes, ...] = ()) -> None:
        kept = self._by_ns.setdefault(namespace, OrderedDict())
        size = (len(json.dumps(conversation, default=str)) + len(json.dumps(response, default=str))
                + sum(len(f.data) for f in attached))
        kept.pop(response["id"], None)
        kept[response["id"]] = Stored(response, conversation, size, attached)
        while len(kept) > self.limit or (len(kept) > 1 and sum(s.size for s in kept.values()) > self.max_bytes):
            kept.popitem(last=False)

    def get(self, namespace: Optional[str], ident: str, param: str = "previous_response_id") -> Stored:
        kept = self._by_ns.get(namespace, OrderedDict())
        if ident not in kept:
            raise APIError(404, f"no response {quote(ident)} is stored here (never made, made with store: false, "
                                "deleted, or evicted)", param=param, code="response_not_found")
        kept.move_to_end(ident)
        return kept[ident]

    def delete(self, namespace: Optional[str], ident: str) -> None:
        self.get(namespace, ident, "response_id")
        del self._by_ns[namespace][ident]


# -- out -------------------------------------------------------------------------------------------


def usage(result: GenerationResult) -> dict[str, Any]:
    r = result.report
    n_out = len(result.tokens)
    return {"input_tokens": r.prompt_tokens,
            "input_tokens_details": {"cached_tokens": r.restored, "cache_write_tokens": 0},
            "output_tokens": n_out, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": r.prompt_tokens + n_out}


def _item_id(p: ParsedResponse, kind: str, index: int) -> str:
    return f"{kind}_" + hashlib.sha256(f"{p.id}:{kind}:{index}".encode()).hexdigest()[:48]


class Output:
    """The output items of a reply, built from its events (the stream's, or a whole reply's):
    a message for its text, a function_call for each call, in the order they began."""

    def __init__(self, p: ParsedResponse) -> None:
        self.p = p
        self.items: list[dict[str, Any]] = []
        self._message: Optional[int] = None  # index of the message item
        self._calls: dict[int, int] = {}  # call index -> item index
        self.seq = 0

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        e = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return e

    def events(self, events: list[ReplyEvent]) -> list[dict[str, Any]]:
        out = []
        for e in events:
            if isinstance(e, TextDelta):
                if self._message is None:
                    self._message = len(self.items)
                    item = {"id": _item_id(self.p, "msg", 0), "type": "message", "status": "in_progress",
                            "role": "assistant", "content": []}
                    self.items.append(item)
                    out.append(self._event("response.output_item.added", output_index=self._message,
                                           item=json.loads(json.dumps(item))))
                    item["content"].append({"type": "output_text", "text": "", "annotations": [], "logprobs": []})
                    out.append(self._event("response.content_part.added", item_id=item["id"],
                                           output_index=self._message, content_index=0,
                                           part={"type": "output_text", "text": "", "annotations": [],
                                                 "logprobs": []}))
                item = self.items[self._message]
                item["content"][0]["text"] += e.text
                out.append(self._event("response.output_text.delta", item_id=item["id"], output_index=self._message,
                                       content_index=0, delta=e.text, logprobs=[]))
            elif isinstance(e, CallStart):
                index = self._calls[e.index] = len(self.items)
                item = {"id": "fc_" + e.id, "type": "function_call", "status": "in_progress", "arguments": "",
                        "call_id": "call_" + e.id, **_namespaced(e.name, self.p.body)}
                self.items.append(item)
                out.append(self._event("response.output_item.added", output_index=index, item=dict(item)))
            elif isinstance(e, CallArguments):
                index = self._calls[e.index]
                self.items[index]["arguments"] += e.fragment
                out.append(self._event("response.function_call_arguments.delta", item_id=self.items[index]["id"],
                                       output_index=index, delta=e.fragment))
            elif isinstance(e, CallEnd):
                index = self._calls[e.index]
                item = self.items[index]
                item["status"] = "completed"
                out.append(self._event("response.function_call_arguments.done", item_id=item["id"],
                                       output_index=index, arguments=item["arguments"], name=item["name"]))
                out.append(self._event("response.output_item.done", output_index=index, item=dict(item)))
        return out

    def close(self, status: str) -> list[dict[str, Any]]:
        """The message item's closing events (its text whole)."""
        if self._message is None:
            return []
        item = self.items[self._message]
        item["status"] = status
        part = item["content"][0]
        return [self._event("response.output_text.done", item_id=item["id"], output_index=self._message,
                            content_index=0, text=part["text"], logprobs=[]),
                self._event("response.content_part.done", item_id=item["id"], output_index=self._message,
                            content_index=0, part=dict(part)),
                self._event("response.output_item.done", output_index=self._message,
                            item=json.loads(json.dumps(item)))]


def response_object(p: ParsedResponse, model: str, status: str, output: list[dict[str, Any]],
                    outcome: Optional[Outcome] = None, error: Optional[APIError] = None) -> dict[str, Any]:
    body = p.body
    incomplete = outcome is not None and outcome.reply.cut
    obj: dict[str, Any] = {
        "id": p.id, "object": "response", "created_at": p.created, "status": status,
        "error": {"code": error.code or error.type, "message": error.message} if error is not None else None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete and status == "incomplete" else None,
        "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
        "model": model, "output": output, "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": p.previous, "reasoning": {"effort": None, "summary": None},
        "store": p.store, "temperature": p.request.sampler.temperature, "text": body.get("text") or {
            "format": {"type": "text"}}, "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [], "top_p": p.request.sampler.top_p,
        "truncation": body.get("truncation") or "disabled", "usage": None, "user": body.get("user"),
        "metadata": body.get("metadata") or {},
    }
    if outcome is not None:
        obj["usage"] = usage(outcome.result)
        obj["verbatim"] = verbatim_report(outcome.result, outcome.queue, p.ignored, outcome.receipt)
    return obj


def conversation(p: ParsedResponse, outcome: Outcome) -> list[dict[str, Any]]:
    """The history and the reply as one assistant message (what a later previous_response_id continues)."""
    reply = outcome.reply
    message: dict[str, Any] = {"role": "assistant", "content": reply.content or ""}
    if reply.calls:
        message["tool_calls"] = [{"id": "call_" + c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}} for c in reply.calls]
    return [*p.history, message]


def final(p: ParsedResponse, model: str, outcome: Outcome) -> dict[str, Any]:
    """A whole (non-streamed) response."""
    output = Output(p)
    output.events(outcome.events)
    status = "incomplete" if outcome.reply.cut else "completed"
    output.close("completed")
    for item in output.items:
        item["status"] = "completed"
    return response_object(p, model, status, output.items, outcome)


class ResponseStream:
    """The events of a streamed response; the response stored at its end (unless store: false)."""

    def __init__(self, p: ParsedResponse, model: str, store: ResponseStore, namespace: Optional[str]) -> None:
        self.p, self.model, self.store, self.namespace = p, model, store, namespace
        self.output = Output(p)

    def _sse(self, events: list[dict[str, Any]]) -> bytes:
        return b"".join(sse(e, e["type"]) for e in events)

    def start(self, gen: Generation) -> bytes:
        head = response_object(self.p, self.model, "in_progress", [])
        created = self.output._event("response.created", response=head)
        return self._sse([created, self.output._event("response.in_progress", response=head)])

    def batch(self, gen: Generation, events: list[StreamEvent]) -> bytes:
        return self._sse(self.output.events(gen.feed_all(events)))

    def end(self, gen: Generation, last: list[ReplyEvent], outcome: Outcome) -> bytes:
        out = self.output.events(last)
        status = "incomplete" if outcome.reply.cut else "completed"
        out += self.output.close("completed")
        obj = response_object(self.p, self.model, status, self.output.items, outcome)
        if self.p.store:
            self.store.put(self.namespace, obj, conversation(self.p, outcome), self.p.files)
        out.append(self.output._event(f"response.{status}", response=obj))
        return self._sse(out)

    def error(self, e: APIError) -> bytes:
        failed = response_object(self.p, self.model, "failed", self.output.items, error=e)
        return self._sse([self.output._event("response.failed", response=failed)])
