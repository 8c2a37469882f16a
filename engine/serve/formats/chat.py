"""OpenAI's chat completions and (legacy) completions: `POST /v1/chat/completions`, `/v1/completions`.

In: the body checked field by field into the engine's `GenerationRequest` (plus what only the
answer needs: stream, logprobs). Every field a request may carry changes the reply as OpenAI
documents it, or is refused (400, naming it) where it would need what this server does not do,
or is accepted and changes nothing (IGNORED: listed in the reply's `verbatim.ignored`). A field
whose value is null is absent (the tutorial loop sends back `message.model_dump()`, whose
`refusal`, `annotations`, `audio`, `function_call` are null). A message's `name` is kept in the
message for the chat template (templates that use it render it). `file` content parts are read
as documents (engine/serve/files.py).

Out: a chat.completion (or text_completion) object, or a stream of chunks: one chunk per token
(its text delta, its logprobs, its tool-call deltas: `function.arguments` fragments as the call
is decoded, engine/serve/reply.py), the last with the finish reason, `usage` and the `verbatim`
object; then `data: [DONE]`.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from engine.bridge import StreamEvent
from engine.serve.files import FileBytes
from engine.serve import files, tools
from engine.serve.generation import Generation, Outcome, sse
from engine.serve.quote import message_fields, quote
from engine.serve.reply import CallArguments, CallStart, Reply, ReplyEvent, TextDelta
from engine.serve.report import TokenLogprob, fingerprint, progress_fields, verbatim_report
from engine.serve.schema import (
    APIError,
    Defaults,
    bad,
    boolean,
    check_fields,
    checked,
    continuation,
    ignored,
    integer,
    model_name,
    number,
    sampler,
    stop_strings,
    text,
    verbatim_flag,
    verbatim_options,
)
from engine.types import MAX_TOP_LOGPROBS, GenerationRequest, GenerationResult, PrefillProgress, RestoreEvent, TokenEvent

# Accepted, checked for type, and changing nothing here: listed in `verbatim.ignored`.
IGNORED = {"user": "a string", "metadata": "an object of strings", "store": "a boolean",
           "prompt_cache_key": "a string", "prompt_cache_retention": "a string", "safety_identifier": "a string",
           "service_tier": "a string", "verbosity": "a string"}
_SAMPLING = {"model", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens", "seed",
             "stop", "stream", "stream_options", "n", "presence_penalty", "frequency_penalty", "logit_bias",
             "verbatim", "user"}
CHAT_FIELDS = _SAMPLING | set(IGNORED) | {"reasoning_effort", "messages", "max_completion_tokens", "logprobs", "top_logprobs",
                                          "response_format", "tools", "functions", "tool_choice", "function_call",
                                          "parallel_tool_calls", "modalities"}
COMPLETION_FIELDS = _SAMPLING | {"prompt", "suffix", "echo", "best_of", "logprobs"}


@dataclass
class ParsedRequest:
    """One validated chat or completion request: what to generate and how to answer."""

    kind: str  # "chat" | "completion"
    model: str  # as the client named it (echoed back)
    request: GenerationRequest
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage
    logprobs: bool = False
    top_logprobs: int = 0
    seed_given: bool = False
    token_ids: bool = False  # verbatim.token_ids: each streamed chunk names its tokens' ids
    progress: bool = False  # verbatim.progress: the stream also tells the restore and the prefill's progress
    ignored: tuple[str, ...] = ()  # fields accepted that changed nothing (verbatim.ignored)
    files: tuple[FileBytes, ...] = ()  # file parts not yet read (the shared path reads them as documents)
    created: int = field(default_factory=lambda: int(time.time()))
    id: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            prefix = "chatcmpl" if self.kind == "chat" else "cmpl"
            self.id = f"{prefix}-{uuid.uuid4().hex}"

    @property
    def prompt_param(self) -> str:
        return "messages" if self.kind == "chat" else "prompt"


# -- in --------------------------------------------------------------------------------------------


def _unsupported(body: dict[str, Any]) -> None:
    n = integer(body, "n", 1, 1, 128)
    if n != 1:
        raise bad("only n=1 is supported", "n")
    for name in ("presence_penalty", "frequency_penalty"):
        if number(body, name, 0.0, -2.0, 2.0) != 0.0:
            raise bad(f"'{name}' is not supported (use 'repetition_penalty')", name)
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise bad("only the 'text' modality is supported", "modalities")
    # tools, tool_choice, parallel_tool_calls, response_format, functions: tools.py (constraint_of)


def _content(m: dict[str, Any], i: int, documents: list[FileBytes]) -> str:
    """A message's text; its `file` parts are collected into `documents`, to be read
    (engine/serve/files.py)."""
    c = m.get("content")
    if c is None and m.get("role") == "assistant" and m.get("tool_calls"):
        return ""  # a reply that is only tool calls
    if isinstance(c, str):
        return text(c, f"messages[{i}].content")
    if isinstance(c, list):  # content parts: text, and files read as documents
        parts = []
        for j, p in enumerate(c):
            if isinstance(p, dict) and p.get("type") == "file":
                if m.get("role") not in ("user", "system", "developer"):
                    raise bad(f"messages[{i}].content[{j}]: file parts go in user and system messages; the "
                              f"{m.get('role')} role takes text parts only", f"messages[{i}].content[{j}]")
                checked(files.collect, documents, checked(files.file_part, p, f"messages[{i}].content[{j}]"),
                        f"messages[{i}].content")
                continue
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise bad(f"messages[{i}].content[{j}]: only text and file parts are supported",
                          f"messages[{i}].content")
            parts.append(p["text"])
        return text("".join(parts), f"messages[{i}].content")
    raise bad(f"messages[{i}].content must be a string or a list of text and file parts", f"messages[{i}].content")


def _messages(body: dict[str, Any]) -> tuple[list[dict[str, Any]], tuple[FileBytes, ...]]:
    """The messages, and the files their file parts carry (in the order first sent)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("'messages' must be a non-empty list of {role, content} objects", "messages")
    out = []
    documents: list[FileBytes] = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}] must be an object", f"messages[{i}]")
        m = {k: v for k, v in m.items() if v is not None}  # null is absent (model_dump() sends them)
        role = m.get("role")
        if role == "developer":  # OpenAI's newer name for the system role
            role = "system"
        if role not in ("system", "user", "assistant", "tool"):
            raise bad(f"messages[{i}].role must be one of system, user, assistant, tool; got {quote(role)}",
                      f"messages[{i}].role")
        refused = message_fields(m, i)  # fields a message cannot carry: refused by name, not dropped (quote.py)
        if refused:
            raise bad(*refused)
        msg = {"role": role, "content": _content(m, i, documents), **checked(tools.message_extras, m, i)}
        if "name" in m:  # the participant's name: the chat template renders it where it takes one
            if not isinstance(m["name"], str) or not m["name"]:
                raise bad(f"messages[{i}].name must be a non-empty string", f"messages[{i}].name")
            msg["name"] = text(m["name"], f"messages[{i}].name")
        out.append(msg)
    checked(tools.check_results, out)  # every tool result answers a call made before it
    return out, tuple(documents)


def _stream_options(body: dict[str, Any], stream: bool) -> bool:
    """stream_options.include_usage (only with "stream": true, as OpenAI says)."""
    opts = body.get("stream_options")
    if opts is None:
        return False
    if not isinstance(opts, dict):
        raise bad("'stream_options' must be an object", "stream_options")
    unknown = sorted(k for k in opts if k != "include_usage")
    if unknown:
        raise bad(f"'stream_options.{unknown[0]}' is not supported", f"stream_options.{unknown[0]}")
    if not stream:
        raise bad("'stream_options' is only allowed with \"stream\": true", "stream_options")
    return boolean(opts, "include_usage")


def _common(body: Any, known: set[str]) -> tuple[dict[str, Any], list[str]]:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    check_fields(body, known)
    skipped = ignored(body, {k: v for k, v in IGNORED.items() if k in known})
    _unsupported(body)
    return body, skipped


def parse_chat(body: Any, defaults: Defaults = Defaults()) -> ParsedRequest:
    """A chat request; `defaults`: the server's cache mode and seed for requests that name none."""
    body, skipped = _common(body, CHAT_FIELDS)
    messages, documents = _messages(body)
    going_on = continuation(body, messages)  # before the tool checks see a partial reply
    settings, seed_given, max_given = sampler(body, defaults)
    logprobs = boolean(body, "logprobs")
    top = int(integer(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS) or 0)
    if top and not logprobs:
        raise bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    stream = boolean(body, "stream")
    include_usage = _stream_options(body, stream)
    # to the chat template where it reads it (gpt-oss), else listed as ignored
    options, more = defaults.template_option("reasoning_effort", body.get("reasoning_effort"), "reasoning_effort")
    req = GenerationRequest(messages, settings, stop=stop_strings(body), top_logprobs=top,
                            max_tokens_fit=not max_given, constraint=checked(tools.constraint_of, body),
                            continuation=going_on, template_options=options,
                            **{"mode": defaults.mode, **verbatim_options(body)})
    return ParsedRequest("chat", model_name(body), req, stream, include_usage, logprobs, top, seed_given,
                         verbatim_flag(body, "token_ids"), verbatim_flag(body, "progress"), tuple(skipped + more),
                         files=documents)


def parse_completion(body: Any, defaults: Defaults = Defaults()) -> ParsedRequest:
    body, skipped = _common(body, COMPLETION_FIELDS)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad("'prompt' must be a string (token-id and batched prompts are not supported)", "prompt")
    prompt = text(prompt, "prompt")
    if boolean(body, "echo"):
        raise bad("'echo' is not supported", "echo")
    if body.get("suffix"):
        raise bad("'suffix' is not supported", "suffix")
    if integer(body, "best_of", 1, 1, 128) != 1:
        raise bad("only best_of=1 is supported", "best_of")
    settings, seed_given, max_given = sampler(body, defaults)
    top = integer(body, "logprobs", None, 0, MAX_TOP_LOGPROBS)  # legacy: an int, the alternatives wanted
    stream = boolean(body, "stream")
    include_usage = _stream_options(body, stream)
    going_on = continuation(body, None)
    if going_on is not None and going_on.text is not None:
        raise bad("'verbatim.continue' of a completion takes the reply's token ids", "verbatim.continue")
    req = GenerationRequest([], settings, stop=stop_strings(body), prompt=prompt, top_logprobs=top or 0,
                            max_tokens_fit=not max_given, continuation=going_on,
                            **{"mode": defaults.mode, **verbatim_options(body)})
    return ParsedRequest("completion", model_name(body), req, stream, include_usage, top is not None, top or 0,
                         seed_given, verbatim_flag(body, "token_ids"), verbatim_flag(body, "progress"), tuple(skipped))


# -- out -------------------------------------------------------------------------------------------


def usage(result: GenerationResult) -> dict[str, Any]:
    """OpenAI's usage. A Continue's reply so far (`continued_from` tokens the client sent back)
    is input the model read, restored or forwarded like the prompt: it counts in prompt_tokens,
    so cached_tokens (what the cache restored of that input) never exceeds it."""
    n_prompt, n_out = result.report.prompt_tokens + (result.report.continued_from or 0), len(result.tokens)
    return {
        "prompt_tokens": n_prompt,
        "completion_tokens": n_out,
        "total_tokens": n_prompt + n_out,
        "prompt_tokens_details": {"cached_tokens": result.report.restored},
    }


def finish_reason(reply: Reply) -> str:
    if reply.ended_with_calls:
        return "tool_calls"
    return "length" if reply.finish == "length" else "stop"


def chat_logprob_entries(entries: list[TokenLogprob]) -> list[dict[str, Any]]:
    return [
        {
            "token": e.token[0],
            "logprob": e.logprob,
            "bytes": e.token[1],
            "top_logprobs": [{"token": t[0], "logprob": lp, "bytes": t[1]} for t, lp in (e.top or [])],
        }
        for e in entries
    ]


def completion_logprobs(entries: list[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """The legacy completions logprobs object (text_offset counts from `offset`)."""
    offsets, pos = [], offset
    for e in entries:
        offsets.append(pos)
        pos += len(e.token[0])
    return {
        "tokens": [e.token[0] for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [({t[0]: lp for t, lp in e.top} if e.top is not None else None) for e in entries],
        "text_offset": offsets,
    }


def _tool_calls(reply: Reply, prefix: str = "call_") -> list[dict[str, Any]]:
    return [{"id": prefix + c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in reply.calls]


def full_response(p: ParsedRequest, model: str, outcome: Outcome) -> dict[str, Any]:
    """A whole (non-streamed) chat.completion or text_completion object."""
    result, reply, entries = outcome.result, outcome.reply, outcome.entries
    if p.kind == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.calls:
            message["tool_calls"] = _tool_calls(reply)
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": {"content": chat_logprob_entries(entries)} if entries is not None else None,
            "finish_reason": finish_reason(reply),
        }
        obj = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": reply.content or "",
            "logprobs": completion_logprobs(entries) if entries is not None else None,
            "finish_reason": finish_reason(reply),
        }
        obj = "text_completion"
    return {
        "id": p.id,
        "object": obj,
        "created": p.created,
        "model": model,
        "system_fingerprint": fingerprint(result.report.model_key),
        "choices": [choice],
        "usage": usage(result),
        "verbatim": verbatim_report(result, outcome.queue, p.ignored, outcome.receipt),
    }


def chunk(p: ParsedRequest, model: str, text: Optional[str], entries: Optional[list[TokenLogprob]],
          finish: Optional[str] = None, role: bool = False, text_offset: int = 0,
          calls: Optional[list[dict[str, Any]]] = None) -> dict[str, Any]:
    """One streamed chunk: a text delta, tool-call deltas and the logprobs of the tokens it covers."""
    if p.kind == "chat":
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        if calls:
            delta["tool_calls"] = calls
        choice: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "logprobs": {"content": chat_logprob_entries(entries)} if entries is not None else None,
            "finish_reason": finish,
        }
        obj = "chat.completion.chunk"
    else:
        choice = {
            "index": 0,
            "text": text or "",
            "logprobs": completion_logprobs(entries, text_offset) if entries is not None else None,
            "finish_reason": finish,
        }
        obj = "text_completion"
    return {"id": p.id, "object": obj, "created": p.created, "model": model, "choices": [choice]}


def _deltas(events: list[ReplyEvent]) -> tuple[str, list[dict[str, Any]]]:
    """The text and the `tool_calls` deltas of some reply events (one entry per call: the first
    names it, the rest carry `function.arguments` fragments, as the openai client assembles)."""
    texts: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for e in events:
        if isinstance(e, TextDelta):
            texts.append(e.text)
        elif isinstance(e, CallStart):
            calls[e.index] = {"index": e.index, "id": "call_" + e.id, "type": "function",
                              "function": {"name": e.name, "arguments": ""}}
        elif isinstance(e, CallArguments):
            entry = calls.setdefault(e.index, {"index": e.index, "function": {"arguments": ""}})
            entry["function"]["arguments"] += e.fragment
    return "".join(texts), list(calls.values())


class ChatStream:
    """The chunks of a streamed chat completion (or completion)."""

    def __init__(self, p: ParsedRequest, model: str) -> None:
        self.p, self.model = p, model
        self.sent = 0  # characters of text sent (text_offset of the completions logprobs)
        self.seen = 0  # tokens whose logprobs were sent
        self.named = 0  # tokens whose ids were sent (verbatim.token_ids)

    def start(self, gen: Generation) -> bytes:
        if self.p.kind != "chat":
            return b""
        # With tools the reply may be only calls: the role chunk then carries no content, so a
        # client that assembles the stream reads content null, as in the non-streamed reply.
        return sse(chunk(self.p, self.model, None if gen.reader.reads_calls else "", None, role=True))

    def batch(self, gen: Generation, events: list[StreamEvent]) -> bytes:
        out = []
        for event in events:  # one chunk per token, one write per batch
            if isinstance(event, (RestoreEvent, PrefillProgress)) and self.p.progress:
                c = chunk(self.p, self.model, None, None)  # no choices: the restore or the prefill's progress
                c["choices"] = []
                c["verbatim"] = progress_fields(event)
                out.append(sse(c))
            if not isinstance(event, TokenEvent):
                continue
            delta, calls = _deltas(gen.feed(event))
            entries = None
            if self.p.logprobs and event.index >= self.seen:
                entry = gen.ticket.entry(event.index)
                if entry is not None:
                    entries, self.seen = [entry], event.index + 1
            ids = [event.token] if self.p.token_ids and event.index >= self.named else None
            if delta or calls or entries or ids:
                content = delta if delta or not gen.reader.reads_calls else None
                c = chunk(self.p, self.model, content, entries, text_offset=self.sent, calls=calls)
                if ids:
                    c["verbatim"] = {"token_ids": ids}
                    self.named = event.index + 1
                out.append(sse(c))
                self.sent += len(delta)
        return b"".join(out)

    def end(self, gen: Generation, last: list[ReplyEvent], outcome: Outcome) -> bytes:
        result, reply = outcome.result, outcome.reply
        rest, calls = _deltas(last)
        out = []
        if calls:
            out.append(chunk(self.p, self.model, None, None, calls=calls))
        entries = outcome.entries[self.seen:] if outcome.entries is not None else None
        # A reply with calls ends without a content delta (content stays null, as non-streamed).
        content = rest if rest or not reply.calls else None
        final = chunk(self.p, self.model, content, entries if self.p.logprobs else None,
                      finish=finish_reason(reply), text_offset=self.sent)
        final["system_fingerprint"] = fingerprint(result.report.model_key)
        final["verbatim"] = verbatim_report(result, outcome.queue, self.p.ignored, outcome.receipt)
        if self.p.include_usage:
            usage_chunk = chunk(self.p, self.model, None, None)
            usage_chunk["choices"] = []
            usage_chunk["usage"] = usage(result)
            out += [final, usage_chunk]
        else:
            final["usage"] = usage(result)
            out.append(final)
        return b"".join(sse(c) for c in out) + b"data: [DONE]\n\n"

    def error(self, e: APIError) -> bytes:
        return sse(e.body())  # clients raise it; no [DONE]: the reply is not complete
