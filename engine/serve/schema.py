"""Request fields every wire format reads the same way, and the errors they raise.

`APIError` is an error answered with an HTTP status (each wire format writes it in its own
envelope: engine/serve/formats/); `ServedModel` is the model being served. The field readers
check exact types (a bool is not a number, a float is not an int) and raise `APIError` naming the
field; `sampler` reads the sampling fields into the engine's `SamplerSettings` (with the server's
seed for a request that names none: `engine serve --seed`). No aiohttp and no MLX here, so all of
it can be tested as plain functions.
"""

from __future__ import annotations

import math
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from engine.errors import RequestError
from engine.types import Continuation, SamplerSettings, normalize_logit_bias
from engine.serve.quote import bare, clip, quote

DEFAULT_MAX_TOKENS = 512  # as mlx_lm.server: a reply that never ends must still end (less if the context is fuller)
MAX_STOP = 4  # stop strings per request (OpenAI's limit)
SEED_MAX = 2**64 - 1  # the engine's PRNG key takes an unsigned 64-bit seed
MAX_LOGIT_BIAS = 300  # biased tokens per request at most

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


@dataclass(frozen=True)
class Defaults:
    """What the server fills in for a request that leaves it out: the cache mode, and the seed
    (`engine serve --seed N`; None: a fresh one per request, reported in `verbatim.seed`). Also
    which TEMPLATE_OPTIONS the served model's chat template reads (`template_reads`)."""

    mode: str = "exact"
    seed: Optional[int] = None
    template_reads: tuple[str, ...] = ()

    def template_option(self, name: str, value: Any, field_name: str) -> tuple[tuple[tuple[str, str], ...], list[str]]:
        """A request field the chat template may take as option `name` (gpt-oss's
        `reasoning_effort`): (the template options, []) where the template reads it, else
        ((), [field_name]): accepted and listed in `verbatim.ignored`."""
        if value is None:
            return (), []
        if not isinstance(value, str):
            raise bad(f"'{field_name}' must be a string", field_name)
        if name in self.template_reads:
            return ((name, text(value, field_name)),), []
        return (), [field_name]


# Options a chat template may read from a request (GenerationRequest.template_options).
TEMPLATE_OPTIONS = ("reasoning_effort",)


def template_reads(tokenizer: Any) -> tuple[str, ...]:
    """The TEMPLATE_OPTIONS a model's chat template reads (its source names them)."""
    source = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(source, dict):  # named templates (default, tool_use, ...)
        source = "\n".join(str(v) for v in source.values())
    return tuple(n for n in TEMPLATE_OPTIONS if re.search(rf"\b{n}\b", str(source)))


@dataclass
class ServedModel:
    """The model being served: its id in the API, other names accepted for it, its cache key."""

    id: str
    key: Optional[str] = None  # the engine's model key: a request runs only on this model
    aliases: tuple[str, ...] = ()
    context_length: Optional[int] = None
    tool_parser: Optional[str] = None  # mlx-lm's tool-call format of the model (reply.py reads calls with it)
    template_reads: tuple[str, ...] = ()  # the TEMPLATE_OPTIONS its chat template reads (template_reads)
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


def number(body: dict[str, Any], name: str, default: float, lo: float, hi: float,
           lo_open: bool = False) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise bad(f"'{name}' must be a number", name)
    if v < lo or v > hi or (lo_open and v == lo):
        raise bad(f"'{name}' must be {'>' if lo_open else '>='} {lo:g} and <= {hi:g}, got {v}", name)
    return float(v)


def integer(body: dict[str, Any], name: str, default: Optional[int], lo: int, hi: int) -> Optional[int]:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(f"'{name}' must be an integer", name)
    if v < lo or v > hi:
        raise bad(f"'{name}' must be between {lo} and {hi}, got {v}", name)
    return v


def boolean(body: dict[str, Any], name: str, default: bool = False) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(f"'{name}' must be a boolean", name)
    return v


def text(value: str, where: str) -> str:
    """`value`, if it is valid Unicode text: JSON can carry a lone UTF-16 surrogate ("\\ud800"),
    which no tokenizer can encode."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        bad_char = value[e.start]
        raise bad(f"{where} holds an unpaired UTF-16 surrogate (U+{ord(bad_char):04X} at character {e.start}), "
                  "which is not valid Unicode text", where) from None
    return value


def stop_strings(body: dict[str, Any], name: str = "stop", limit: int = MAX_STOP) -> tuple[str, ...]:
    v = body.get(name)
    if v is None:
        return ()
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise bad(f"'{name}' must be a string or a list of strings", name)
    if len(v) > limit:
        raise bad(f"'{name}' takes at most {limit} strings", name)
    return tuple(text(s, name) for s in v if s)


def check_fields(body: dict[str, Any], known: set[str] | frozenset[str]) -> None:
    """Unknown fields are refused by name (they would change the reply in a way we do not); a
    field whose value is null is absent (a client sends back what it was given: `refusal: null`)."""
    unknown = sorted(k for k in body if k not in known and body[k] is not None)
    if unknown:
        more = f" (nor {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise bad(f"{quote(unknown[0])} is not supported by this server{more}", bare(unknown[0]))


def model_name(body: dict[str, Any]) -> str:
    v = body.get("model")
    if v is None:
        return ""
    if not isinstance(v, str):
        raise bad("'model' must be a string", "model")
    return v


def logit_bias(body: dict[str, Any]) -> tuple[tuple[int, float], ...]:
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


def max_tokens(body: dict[str, Any]) -> Optional[int]:
    """max_completion_tokens (OpenAI's current name) or max_tokens; both, and different: refused.
    None: neither was given."""
    new = integer(body, "max_completion_tokens", None, 1, 1 << 31)
    old = integer(body, "max_tokens", None, 1, 1 << 31)
    if new is not None and old is not None and new != old:
        raise bad(f"'max_completion_tokens' ({new}) and 'max_tokens' ({old}) disagree; send one of them",
                  "max_completion_tokens")
    return new if new is not None else old


def sampler(body: dict[str, Any], defaults: Defaults = Defaults(), max_temperature: float = 2.0,
            max_tokens_given: Optional[int] = None) -> tuple[SamplerSettings, bool, bool]:
    """The sampler settings, whether a seed was given, and whether max_tokens was
    (`max_tokens_given`: a format's own max tokens field, read by it)."""
    limit = max_tokens_given if max_tokens_given is not None else max_tokens(body)
    seed = integer(body, "seed", None, 0, SEED_MAX)
    seed_given = seed is not None
    if seed is None:  # the server's (`serve --seed`), else a fresh one, reported back: any reply can be reproduced
        seed = defaults.seed if defaults.seed is not None else secrets.randbits(31)
    settings = SamplerSettings(
        temperature=number(body, "temperature", 1.0, 0.0, max_temperature),
        top_p=number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        top_k=int(integer(body, "top_k", 0, 0, 1 << 31) or 0),
        min_p=number(body, "min_p", 0.0, 0.0, 1.0),
        repetition_penalty=number(body, "repetition_penalty", 1.0, 0.0, 10.0, lo_open=True),
        seed=seed,
        max_tokens=limit if limit is not None else DEFAULT_MAX_TOKENS,
        logit_bias=logit_bias(body),
    )
    return settings, seed_given, limit is not None


def verbatim_options(body: dict[str, Any]) -> dict[str, Any]:
    """Our extension: `"verbatim": {"mode": "exact" | "fast", "cache": bool, "token_ids": bool,
    "progress": bool, "receipt": bool, "continue": ...}`: the request options (`token_ids`,
    `progress` and `receipt` are the answer's: `verbatim_flag`, `receipt_wanted`)."""
    v = body.get("verbatim")
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise bad("'verbatim' must be an object", "verbatim")
    out: dict[str, Any] = {}
    unknown = sorted(k for k in v if k not in ("mode", "cache", "token_ids", "progress", "continue", "receipt"))
    if unknown:
        name = bare(unknown[0])
        raise bad(f"'verbatim.{name}' is not supported (only 'mode', 'cache', 'token_ids', 'progress', 'continue' "
                  "and 'receipt')", f"verbatim.{name}")
    if not isinstance(v.get("receipt", False), bool):
        raise bad("'verbatim.receipt' must be a boolean", "verbatim.receipt")
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


def receipt_wanted(body: Any) -> bool:
    """`"verbatim": {"receipt": true}`: the reply's `verbatim` object carries its receipt, which
    records the request as sent (`python -m engine verify` replays it)."""
    v = body.get("verbatim") if isinstance(body, dict) else None
    return isinstance(v, dict) and v.get("receipt") is True


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


def checked(check: Callable[..., Any], *args: Any) -> Any:
    """A check that raises RequestError (tools.py, engine/constraint.py), its error as a 400
    naming the field."""
    try:
        return check(*args)
    except RequestError as e:
        raise bad(str(e), e.param) from None





_KINDS: dict[str, Callable[[Any], bool]] = {
    "a string": lambda v: isinstance(v, str),
    "a boolean": lambda v: isinstance(v, bool),
    "an object": lambda v: isinstance(v, dict),
    "an object of strings": lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
    "a list": lambda v: isinstance(v, list),
    "a string or an object": lambda v: isinstance(v, (str, dict)),
}


def ignored(body: dict[str, Any], names: dict[str, str], where: str = "") -> list[str]:
    """The fields of `names` (name -> its type, a key of _KINDS) the body carries, not null:
    accepted, changing nothing here, and listed in the reply's `verbatim.ignored`."""
    out = []
    for name, kind in names.items():
        v = body.get(name)
        if v is None:
            continue
        if not _KINDS[kind](v):
            raise bad(f"'{where}{name}' must be {kind}", f"{where}{name}")
        out.append(where + name)
    return out
