"""OpenAI-style request validation for the local server (the answers' shapes: responses.py).

Requests are checked field by field into the engine's own `GenerationRequest` (plus what only
the HTTP side needs: stream, logprobs); anything malformed raises `APIError`, which the app
turns into an OpenAI error object with the right status. No aiohttp and no MLX here, so all of
it can be tested as plain functions. Every endpoint's fields and their checks are in this one
module, so the contract with OpenAI clients reads as one table.
"""

from __future__ import annotations

import math
import secrets
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from engine.errors import RequestError
from engine.documents.extract import Document
from engine.serve import files, tools
from engine.types import (
    MAX_TOP_LOGPROBS,
    Continuation,
    GenerationRequest,
    SamplerSettings,
    normalize_logit_bias,
)
from engine.serve.quote import bare, clip, message_fields, quote

DEFAULT_MAX_TOKENS = 512  # as mlx_lm.server: a reply that never ends must still end (less if the context is fuller)
MAX_STOP = 4  # stop strings per request (OpenAI's limit)
SEED_MAX = 2**64 - 1  # the engine's PRNG key takes an unsigned 64-bit seed
MAX_LOGIT_BIAS = 300  # biased tokens per request at most

# Every field a request may carry. Each one changes the reply as OpenAI documents it, or is
# refused (400, naming it) where it would need what this server does not do, or is one of the
# documented no-ops in NO_OPS. Anything else is refused as unknown, as OpenAI does.
_SAMPLING = {"model", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens", "seed",
             "stop", "stream", "stream_options", "n", "presence_penalty", "frequency_penalty", "logit_bias",
             "verbatim", "user"}
CHAT_FIELDS = _SAMPLING | {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "response_format",
                           "tools", "functions", "tool_choice", "function_call", "parallel_tool_calls",
                           "modalities", "metadata", "store"}
COMPLETION_FIELDS = _SAMPLING | {"prompt", "suffix", "echo", "best_of", "logprobs"}
NO_OPS = ("user", "metadata", "store")  # accepted, checked for type, change nothing


class APIError(Exception):
    """An error answered as `{"error": {...}}` with an HTTP status (OpenAI's shape)."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: Optional[str] = None, code: Optional[str] = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: Optional[str] = None, code: Optional[str] = None) -> APIError:
    return APIError(400, message, param=param, code=code)


@dataclass
class ParsedRequest:
    """One validated API request: what to generate and how to answer."""

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
    created: int = field(default_factory=lambda: int(time.time()))
    id: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            prefix = "chatcmpl" if self.kind == "chat" else "cmpl"
            self.id = f"{prefix}-{uuid.uuid4().hex}"


@dataclass
class ServedModel:
    """The model being served: its id in the API, other names accepted for it, its cache key."""

    id: str
    key: Optional[str] = None  # the engine's model key: a request runs only on this model
    aliases: tuple[str, ...] = ()
    context_length: Optional[int] = None
    tool_parser: Optional[str] = None  # mlx-lm's tool-call format of the model (tools.py reads calls with it)
    chunk: Optional[int] = None  # the engine's prefill chunk size (a client's receipts name it)

    @classmethod
    def of(cls, info: Any, spec: Optional[str] = None) -> "ServedModel":
        """From the engine's ModelInfo (and the spec it was loaded with: 'demo', a folder...)."""
        names = [info.name, Path(info.path).name, info.path]
        ident = info.name
        if spec:
            names.append(spec)
            if "/" not in spec and "\\" not in spec:
                ident = spec  # a short spec ('demo', a repo id's tail) is what users will type
        return cls(ident, info.key, tuple(n for n in dict.fromkeys(names) if n and n != ident),
                   getattr(info, "context_length", None), getattr(info, "tool_parser", None))

    def matches(self, name: str) -> bool:
        return name == "" or name == self.id or name in self.aliases

    @property
    def public_aliases(self) -> tuple[str, ...]:
        """The aliases a response may show: no file system paths (they are accepted, not shown)."""
        return tuple(a for a in self.aliases if "/" not in a and "\\" not in a)


# -- field readers: exact types (a bool is not a number, a float is not an int) -----------------


def _number(body: dict[str, Any], name: str, default: float, lo: float, hi: float,
            lo_open: bool = False) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise bad(f"'{name}' must be a number", name)
    if v < lo or v > hi or (lo_open and v == lo):
        raise bad(f"'{name}' must be {'>' if lo_open else '>='} {lo:g} and <= {hi:g}, got {v}", name)
    return float(v)


def _int(body: dict[str, Any], name: str, default: Optional[int], lo: int, hi: int) -> Optional[int]:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(f"'{name}' must be an integer", name)
    if v < lo or v > hi:
        raise bad(f"'{name}' must be between {lo} and {hi}, got {v}", name)
    return v


def _bool(body: dict[str, Any], name: str, default: bool = False) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(f"'{name}' must be a boolean", name)
    return v


def _text(value: str, where: str) -> str:
    """`value`, if it is valid Unicode text: JSON can carry a lone UTF-16 surrogate ("\\ud800"),
    which no tokenizer can encode."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        bad_char = value[e.start]
        raise bad(f"{where} holds an unpaired UTF-16 surrogate (U+{ord(bad_char):04X} at character {e.start}), "
                  "which is not valid Unicode text", where) from None
    return value


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    v = body.get("stop")
    if v is None:
        return ()
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise bad("'stop' must be a string or a list of strings", "stop")
    if len(v) > MAX_STOP:
        raise bad(f"'stop' takes at most {MAX_STOP} strings", "stop")
    return tuple(_text(s, "stop") for s in v if s)


def _fields(body: dict[str, Any], known: set[str]) -> None:
    """Unknown fields are refused by name (they would change the reply in a way we do not)."""
    unknown = sorted(k for k in body if k not in known)
    if unknown:
        more = f" (nor {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise bad(f"{quote(unknown[0])} is not supported by this server{more}", bare(unknown[0]))


def _no_ops(body: dict[str, Any]) -> None:
    """`user`, `metadata`, `store`: accepted as OpenAI types them, and change nothing here."""
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise bad("'user' must be a string", "user")
    meta = body.get("metadata")
    if meta is not None and (not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values())):
        raise bad("'metadata' must be an object of strings", "metadata")
    if body.get("store") is not None and not isinstance(body["store"], bool):
        raise bad("'store' must be a boolean", "store")


def _unsupported(body: dict[str, Any]) -> None:
    n = _int(body, "n", 1, 1, 128)
    if n != 1:
        raise bad("only n=1 is supported", "n")
    for name in ("presence_penalty", "frequency_penalty"):
        if _number(body, name, 0.0, -2.0, 2.0) != 0.0:
            raise bad(f"'{name}' is not supported (use 'repetition_penalty')", name)
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise bad("only the 'text' modality is supported", "modalities")
    # tools, tool_choice, parallel_tool_calls, response_format, functions: tools.py (constraint_of)


def _model(body: dict[str, Any]) -> str:
    v = body.get("model")
    if v is None:
        return ""
    if not isinstance(v, str):
        raise bad("'model' must be a string", "model")
    return v


def _logit_bias(body: dict[str, Any]) -> tuple[tuple[int, float], ...]:
    v = body.get("logit_bias")
    if v is None:
        return ()
    if not isinstance(v, dict):
        raise bad("'logit_bias' must be an object mapping token ids (as strings) to a bias from -100 to 100",
                  "logit_bias")
    if len(v) > MAX_LOGIT_BIAS:
        raise bad(f"'logit_bias' takes at most {MAX_LOGIT_BIAS} tokens", "logit_bias")
    for k in v:  # one spelling per id: {"05": 1, "5": 2} would merge silently
        if not k.isdigit() or not k.isascii() or (k != "0" and k.startswith("0")):
            raise bad("'logit_bias' keys must be token ids written as decimal strings without leading zeros, "
                      f"got {quote(k)}", "logit_bias")
    try:
        return normalize_logit_bias(v)
    except ValueError as e:
        raise bad(clip(str(e)), "logit_bias") from None


def _max_tokens(body: dict[str, Any]) -> Optional[int]:
    """max_completion_tokens (OpenAI's current name) or max_tokens; both, and different: refused.
    None: neither was given."""
    new = _int(body, "max_completion_tokens", None, 1, 1 << 31)
    old = _int(body, "max_tokens", None, 1, 1 << 31)
    if new is not None and old is not None and new != old:
        raise bad(f"'max_completion_tokens' ({new}) and 'max_tokens' ({old}) disagree; send one of them",
                  "max_completion_tokens")
    return new if new is not None else old


def _sampler(body: dict[str, Any]) -> tuple[SamplerSettings, bool, bool]:
    """The sampler settings, whether a seed was given, and whether max_tokens was."""
    max_tokens = _max_tokens(body)
    seed = _int(body, "seed", None, 0, SEED_MAX)
    seed_given = seed is not None
    if seed is None:
        seed = secrets.randbits(31)  # reported back: any reply can be reproduced
    settings = SamplerSettings(
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        top_k=int(_int(body, "top_k", 0, 0, 1 << 31) or 0),
        min_p=_number(body, "min_p", 0.0, 0.0, 1.0),
        repetition_penalty=_number(body, "repetition_penalty", 1.0, 0.0, 10.0, lo_open=True),
        seed=seed,
        max_tokens=max_tokens if max_tokens is not None else DEFAULT_MAX_TOKENS,
        logit_bias=_logit_bias(body),
    )
    return settings, seed_given, max_tokens is not None


def _verbatim_options(body: dict[str, Any]) -> dict[str, Any]:
    """Our extension: `"verbatim": {"mode": "exact" | "fast", "cache": bool, "token_ids": bool,
    "progress": bool}`: the request options (`token_ids` and `progress` are the answer's:
    `verbatim_flag`)."""
    v = body.get("verbatim")
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise bad("'verbatim' must be an object", "verbatim")
    out: dict[str, Any] = {}
    unknown = sorted(k for k in v if k not in ("mode", "cache", "token_ids", "progress", "continue"))
    if unknown:
        name = bare(unknown[0])
        raise bad(f"'verbatim.{name}' is not supported (only 'mode', 'cache', 'token_ids', 'progress' and "
                  "'continue')", f"verbatim.{name}")
    if "mode" in v:
        if v["mode"] not in ("exact", "fast"):
            raise bad("'verbatim.mode' must be 'exact' or 'fast'", "verbatim.mode")
        out["mode"] = v["mode"]
    if "cache" in v:
        if not isinstance(v["cache"], bool):
            raise bad("'verbatim.cache' must be a boolean", "verbatim.cache")
        out["use_cache"] = v["cache"]
    return out


def continuation(body: dict[str, Any], messages: Optional[list[dict[str, Any]]]) -> Optional[Continuation]:
    """Our Continue (OpenAI has none): `"verbatim": {"continue": [ids]}` goes on with the reply
    whose token ids so far these are (the reply that was never stopped, bit for bit), `true`
    with the text of the last message, an assistant one (encoded: it may give other ids). A last
    assistant message is the reply so far and leaves `messages` (its ids, when given, win)."""
    v = body.get("verbatim")
    c = v.get("continue") if isinstance(v, dict) else None
    if c is None or c is False:
        return None
    last_is_reply = bool(messages) and messages[-1]["role"] == "assistant"
    text = messages.pop()["content"] if last_is_reply and messages is not None else None
    if c is True:
        if text is None:
            raise bad("'verbatim.continue': true continues the last message, which must be the assistant's",
                      "verbatim.continue")
        return Continuation(text=text)
    if (not isinstance(c, list) or not c
            or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in c)):
        raise bad("'verbatim.continue' must be true or a non-empty list of token ids", "verbatim.continue")
    return Continuation(tuple(c))


def verbatim_flag(body: dict[str, Any], name: str) -> bool:
    """An answer option of ours, false unless asked. `"verbatim": {"token_ids": true}`: every
    streamed chunk that carries tokens also names their ids (`"verbatim": {"token_ids": [...]}`),
    so a client keeps the ids of a reply it stops. `"verbatim": {"progress": true}`: the stream
    also carries, in chunks with no choices, what the prompt cache restored before the prefill
    (`"verbatim": {"restore": {...the report so far, "planned": [[start, end], ...]}}`) and the
    prefill's progress (`"verbatim": {"prefill": {"done": n, "total": n}}`): what a debug view
    shows while a run goes on, and what a client that stops the run knows it did."""
    v = body.get("verbatim")
    if not isinstance(v, dict) or name not in v:
        return False
    if not isinstance(v[name], bool):
        raise bad(f"'verbatim.{name}' must be a boolean", f"verbatim.{name}")
    return v[name]


def _content(m: dict[str, Any], i: int, documents: list[Document]) -> str:
    """A message's text; its `file` parts are read into `documents` (engine/serve/files.py)."""
    c = m.get("content")
    if c is None and m.get("role") == "assistant" and m.get("tool_calls"):
        return ""  # a reply that is only tool calls
    if isinstance(c, str):
        return _text(c, f"messages[{i}].content")
    if isinstance(c, list):  # content parts: text, and files read as documents
        parts = []
        for j, p in enumerate(c):
            if isinstance(p, dict) and p.get("type") == "file" and m.get("role") in ("user", "system"):
                files.collect(documents, _checked(files.file_part, p, f"messages[{i}].content[{j}]"))
                continue
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise bad(f"messages[{i}].content[{j}]: only text and file parts are supported",
                          f"messages[{i}].content")
            parts.append(p["text"])
        return _text("".join(parts), f"messages[{i}].content")
    raise bad(f"messages[{i}].content must be a string or a list of text and file parts", f"messages[{i}].content")


def _messages(body: dict[str, Any]) -> tuple[list[dict[str, str]], tuple[Document, ...]]:
    """The messages, and the documents their file parts carry (in the order first sent)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("'messages' must be a non-empty list of {role, content} objects", "messages")
    out = []
    documents: list[Document] = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}] must be an object", f"messages[{i}]")
        role = m.get("role")
        if role == "developer":  # OpenAI's newer name for the system role
            role = "system"
        if role not in ("system", "user", "assistant", "tool"):
            raise bad(f"messages[{i}].role must be one of system, user, assistant, tool; got {quote(role)}",
                      f"messages[{i}].role")
        refused = message_fields(m, i)  # name, …: refused by name, not dropped (quote.py)
        if refused:
            raise bad(*refused)
        out.append({"role": role, "content": _content(m, i, documents), **_checked(tools.message_extras, m, i)})
    _checked(tools.check_results, out)  # every tool result answers a call made before it
    return out, tuple(documents)


def _checked(check: Any, *args: Any) -> Any:
    """A tools.py check, its RequestError as a 400 naming the field."""
    try:
        return check(*args)
    except RequestError as e:
        raise bad(str(e), e.param) from None


def _stream_options(body: dict[str, Any], stream: bool) -> bool:
    """stream_options.include_usage (only with "stream": true, as OpenAI says)."""
    opts = body.get("stream_options")
    if opts is None:
        return False
    if not isinstance(opts, dict):
        raise bad("'stream_options' must be an object", "stream_options")
    unknown = sorted(k for k in opts if k != "include_usage")
    if unknown:
        name = bare(unknown[0])
        raise bad(f"'stream_options.{name}' is not supported", f"stream_options.{name}")
    if not stream:
        raise bad("'stream_options' is only allowed with \"stream\": true", "stream_options")
    return _bool(opts, "include_usage")


def _common(body: Any, known: set[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    _fields(body, known)
    _no_ops(body)
    _unsupported(body)
    return body


def parse_chat(body: Any, mode: str = "exact") -> ParsedRequest:
    """A chat request; `mode` is the server's cache mode for requests that do not name one."""
    body = _common(body, CHAT_FIELDS)
    messages, documents = _messages(body)
    going_on = continuation(body, messages)  # before the tool checks see a partial reply
    settings, seed_given, max_given = _sampler(body)
    logprobs = _bool(body, "logprobs")
    top = int(_int(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS) or 0)
    if top and not logprobs:
        raise bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    stream = _bool(body, "stream")
    include_usage = _stream_options(body, stream)
    req = GenerationRequest(messages, settings, stop=_stop(body), top_logprobs=top, max_tokens_fit=not max_given,
                            constraint=_checked(tools.constraint_of, body), continuation=going_on, documents=documents,
                            **{"mode": mode, **_verbatim_options(body)})
    return ParsedRequest("chat", _model(body), req, stream, include_usage, logprobs, top, seed_given,
                         verbatim_flag(body, "token_ids"), verbatim_flag(body, "progress"))


def parse_completion(body: Any, mode: str = "exact") -> ParsedRequest:
    body = _common(body, COMPLETION_FIELDS)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad("'prompt' must be a string (token-id and batched prompts are not supported)", "prompt")
    prompt = _text(prompt, "prompt")
    if _bool(body, "echo"):
        raise bad("'echo' is not supported", "echo")
    if body.get("suffix"):
        raise bad("'suffix' is not supported", "suffix")
    if _int(body, "best_of", 1, 1, 128) != 1:
        raise bad("only best_of=1 is supported", "best_of")
    settings, seed_given, max_given = _sampler(body)
    top = _int(body, "logprobs", None, 0, MAX_TOP_LOGPROBS)  # legacy: an int, the alternatives wanted
    stream = _bool(body, "stream")
    include_usage = _stream_options(body, stream)
    going_on = continuation(body, None)
    if going_on is not None and going_on.text is not None:
        raise bad("'verbatim.continue' of a completion takes the reply's token ids", "verbatim.continue")
    req = GenerationRequest([], settings, stop=_stop(body), prompt=prompt, top_logprobs=top or 0,
                            max_tokens_fit=not max_given, continuation=going_on,
                            **{"mode": mode, **_verbatim_options(body)})
    return ParsedRequest("completion", _model(body), req, stream, include_usage, top is not None, top or 0,
                         seed_given, verbatim_flag(body, "token_ids"), verbatim_flag(body, "progress"))
