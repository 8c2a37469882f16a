"""The engine's vocabulary: what a generation is asked to do and what it tells the outside world.

Requests (sampler settings, the conversation), streamed events, the cache report and the result.
All plain dataclasses with `to_dict()`: the CLI prints them as JSON, the app stores them and
renders them without knowing anything about MLX. JSON appears only at those edges.
"""

from __future__ import annotations

import re
import threading
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Callable, Literal, Optional, Sequence, Union

from engine.constraint import Constraint, tool_message_keys
from engine.documents.extract import Document
from engine.errors import Cancelled, RequestError

Mode = Literal["exact", "fast"]
Progress = Callable[[float, str], None]  # (fraction done 0..1, what is happening)
ContextPolicy = Literal["refuse", "truncate"]
# {"role": "system" | "user" | "assistant" | "tool", "content": str}; an assistant message may
# also carry "tool_calls" (OpenAI's shape, arguments a JSON string), a tool message "tool_call_id".
Message = dict[str, Any]

ROLES = ("system", "user", "assistant")  # what the app's conversations hold
MESSAGE_ROLES = (*ROLES, "tool")  # what a request may send (tool results: engine/constraint.py)
DEFAULT_CHUNK = 512
MAX_TOP_LOGPROBS = 20  # alternatives reported per token at most (OpenAI's limit)
# Keyword arguments for the chat template beyond the conversation and its tools: (name, value)
# pairs sorted by name (gpt-oss's `reasoning_effort`: "low" | "medium" | "high").
TemplateOptions = tuple[tuple[str, str], ...]
MAX_TEMPLATE_OPTIONS = 16
MAX_TEMPLATE_OPTION_CHARS = 1024
# What the template receives anyway (transformers' apply_chat_template parameters and the
# tokenizer's special tokens): an option may not replace them.
RESERVED_TEMPLATE_NAMES = frozenset({
    "messages", "conversation", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
    "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs", "raise_exception", "strftime_now",
    "enable_thinking",  # mlx-lm sets it from the template (a string "false" would read as true)
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
    "additional_special_tokens"})
_OPTION_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


@dataclass(frozen=True)
class SamplerSettings:
    """Sampling knobs. temperature == 0 is greedy; the seed fixes every random draw."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    repetition_context: int = 64
    seed: int = 0
    max_tokens: int = 256
    # Added to the logits before sampling (OpenAI's logit_bias): (token id, bias) pairs sorted
    # by id, bias in [-100, 100]. Part of the settings, so reports and receipts carry it and a
    # biased reply regenerates identically.
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "logit_bias", normalize_logit_bias(self.logit_bias))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        # {"id": bias} as OpenAI writes it; left out when empty so settings stored before it
        # existed (rows, receipts) read back and compare unchanged.
        bias = d.pop("logit_bias")
        if bias:
            d["logit_bias"] = {str(t): b for t, b in bias}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SamplerSettings":
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)


LOGIT_BIAS_MAX = 100.0  # |bias| at most (OpenAI's range)


def normalize_logit_bias(bias: Any) -> tuple[tuple[int, float], ...]:
    """{"id": bias} or [(id, bias)] -> ((id, bias), ...) sorted by id; ValueError if malformed."""
    if not bias:
        return ()
    pairs = bias.items() if isinstance(bias, dict) else bias
    out: dict[int, float] = {}
    for pair in pairs:
        try:
            t, b = pair
        except (TypeError, ValueError):
            raise ValueError("logit_bias must map token ids to numbers") from None
        if isinstance(t, str) and t.strip().isdigit():
            t = int(t)
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ValueError(f"logit_bias: {t!r} is not a token id")
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not -LOGIT_BIAS_MAX <= b <= LOGIT_BIAS_MAX:
            raise ValueError(f"logit_bias: the bias for token {t} must be a number from -100 to 100, got {b!r}")
        out[t] = float(b)
    return tuple(sorted(out.items()))


@dataclass(frozen=True)
class Continuation:
    """The reply so far of a generation to continue (stopped, or ended at max_tokens): its token
    ids as generated (`tokens`), or its text (`text`, encoded by the engine: a text may encode to
    other ids than the ones generated, so only `tokens` promises the unstopped run's reply).
    `logprobs`, when given, let the engine compare the whole reply with an earlier one."""

    tokens: tuple[int, ...] = ()
    text: Optional[str] = None
    logprobs: tuple[float, ...] = ()


@dataclass(frozen=True)
class GenerationRequest:
    """One reply to generate for a whole conversation (`messages` ends with a user turn), or
    a continuation of raw text (`prompt`: no chat template, e.g. for base models)."""

    messages: list[Message]
    sampler: SamplerSettings = field(default_factory=SamplerSettings)
    mode: Mode = "exact"
    use_cache: bool = True  # False: neither look up nor store (a cold run)
    stop: tuple[str, ...] = ()
    # When prompt + max_tokens exceeds the model's context: "refuse" (an error before any
    # prefill) or "truncate" (leave out the oldest turns, never the system prompt or the last
    # message; deterministic, so a regenerate stays instant and identical).
    context_policy: ContextPolicy = "refuse"
    context_length: Optional[int] = None  # use at most this many tokens (never more than the model's)
    prompt: Optional[str] = None  # raw text, encoded as is (BOS per the tokenizer); messages unused
    top_logprobs: int = 0  # also report the N most likely tokens at every step (0: none)
    # Whose prompt-cache snapshots this request may restore and adds to (None: the app window's
    # own). Part of the cache's lookup key, so namespaces never match each other's snapshots.
    cache_namespace: Optional[str] = None
    # max_tokens is a default, not the client's: shrink it to the room left in the context
    # rather than refuse the request (the server's default max_tokens).
    max_tokens_fit: bool = False
    # Tools offered and the output's shape (tool_choice, response_format): engine/constraint.py.
    constraint: Optional[Constraint] = None
    # Files read as text (engine/documents/), placed at the end of the system message in this
    # order, a cut at each one's end, so every conversation about them shares their state.
    documents: tuple[Document, ...] = ()
    # Go on with this reply (its messages end with the user turn the reply answers): the result
    # holds only the new tokens, equal to what the reply that was never stopped decoded next.
    # max_tokens counts the whole reply (docs/design.md, "Continue").
    continuation: Optional[Continuation] = None
    # Handed to the chat template as keyword arguments (a template that does not read one renders
    # as without it). Part of the request's identity: receipts record them.
    template_options: TemplateOptions = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "template_options", normalize_template_options(self.template_options))


def normalize_template_options(options: Any) -> TemplateOptions:
    """{"name": "value"} or [(name, value)] -> ((name, value), ...) sorted by name; RequestError
    (naming `template_options`) when a name is not an identifier, is one the template gets anyway
    (RESERVED_TEMPLATE_NAMES), repeats, or a value is not a string."""
    if not options:
        return ()
    items = list(options.items()) if isinstance(options, dict) else options
    if not isinstance(items, (list, tuple)) or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in items):
        raise RequestError("template_options must map names to strings", "template_options")
    if len(items) > MAX_TEMPLATE_OPTIONS:
        raise RequestError(f"template_options: at most {MAX_TEMPLATE_OPTIONS} options", "template_options")
    out: dict[str, str] = {}
    for name, value in items:
        if not isinstance(name, str) or not _OPTION_NAME.match(name):
            raise RequestError(f"template_options: {str(name)[:64]!r} is not a name (letters, digits, '_')",
                               "template_options")
        if name in RESERVED_TEMPLATE_NAMES:
            raise RequestError(f"template_options: {name!r} is set by the engine, not by an option",
                               "template_options")
        if name in out:
            raise RequestError(f"template_options: {name!r} is given twice", "template_options")
        if not isinstance(value, str) or len(value) > MAX_TEMPLATE_OPTION_CHARS:
            raise RequestError(f"template_options: {name!r} must be a string of at most "
                               f"{MAX_TEMPLATE_OPTION_CHARS} characters", "template_options")
        out[name] = value
    return tuple(sorted(out.items()))


MAX_NAME_CHARS = 64  # a message's `name` (OpenAI's limit)
# OpenAI's pattern for a message's name: no whitespace and none of < | \ / > (so no control token's text)
_MESSAGE_NAME = re.compile(r"^[^\s<|\\/>]+$")


def validate_messages(messages: Any) -> list[Message]:
    """Check an OpenAI-style message list and return it normalised; raise RequestError if bad.
    Tool calls and tool results keep their own keys (engine/constraint.py checks them), and so
    does a participant's `name` (the chat template gets it: one that renders names shows it,
    others render the message as without it)."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {role, content} objects")
    out: list[Message] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise RequestError(f"message {i} must be an object with 'role' and 'content'")
        if m["role"] not in MESSAGE_ROLES:
            raise RequestError(f"message {i} has unknown role {m['role']!r} "
                               f"(expected one of {', '.join(MESSAGE_ROLES)})")
        if not isinstance(m["content"], str):
            raise RequestError(f"message {i} content must be a string")
        out.append({"role": m["role"], "content": m["content"], **_name(m, i), **tool_message_keys(m, i)})
    return out


def _name(m: dict[str, Any], i: int) -> dict[str, Any]:
    """{"name": ...} when message `i` names its participant (a null name is no name)."""
    name = m.get("name")
    if name is None:
        return {}
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS or not _MESSAGE_NAME.match(name):
        raise RequestError(f"messages[{i}].name must be 1 to {MAX_NAME_CHARS} characters without whitespace "
                           "or any of < | \\ / >", f"messages[{i}].name")
    return {"name": name}


FinishReason = Literal["stop", "length", "context", "cancelled", "error"]


@dataclass
class PrefillProgress:
    """Emitted after every prefill chunk (and once before the first)."""

    done: int  # prompt tokens already in the cache (restored + prefilled)
    total: int  # prompt tokens in all


@dataclass
class TokenEvent:
    """One decoded token (one event per token). `text` is the new text it completes: never half
    a character, so empty while a character is incomplete or a piece is held back."""

    index: int
    token: int
    logprob: float
    text: str
    top_logprobs: Optional[list[tuple[int, float]]] = None  # (id, logprob) best first, when asked


@dataclass
class RestoreEvent:
    """Emitted once per generation, right after the prompt cache's restore and before the first
    prefill chunk: what was restored and from where (the snapshot used, every layer's offset, the
    plan's declines) and the prefill that follows. `report` is the generation's CacheReport as
    far as it is known then (nothing forwarded, stored or timed yet): what a debug view shows
    while the run goes on, until the final report replaces it."""

    report: "CacheReport"
    planned: list[list[int]]  # [start, end) of each forward before decode, the last prompt token's included

    @property
    def planned_tokens(self) -> int:
        """Tokens the prefill will forward (the last prompt token included)."""
        return sum(end - start for start, end in self.planned)

    def report_at(self, done: int, decoding: bool = False) -> "CacheReport":
        """The report as far as the run got: the cache holds `done` prompt tokens (the last
        PrefillProgress), or the prefill is over and decode began (`decoding`: every planned
        forward made, the last prompt token's included). A copy; this event is left as it is."""
        made = self.planned if decoding else [c for c in self.planned if c[1] <= done]
        return replace(self.report, chunks=[list(c) for c in made], prefill_tokens=sum(b - a for a, b in made))

    def to_dict(self) -> dict[str, Any]:
        return {"report": self.report.to_dict(), "planned": [list(c) for c in self.planned]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RestoreEvent":
        return cls(CacheReport.from_dict(d.get("report")), [[int(a), int(b)] for a, b in d.get("planned") or []])


Event = Union[RestoreEvent, PrefillProgress, TokenEvent]
EventCallback = Callable[[Event], None]


class CancelToken:
    """Thread-safe cancel flag, checked between prefill chunks and decode steps."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def check(self, what: str = "cancelled") -> None:
        """Raise `Cancelled(what)` if cancelled: for work that unwinds by exception (imports)."""
        if self._event.is_set():
            raise Cancelled(what)


@dataclass
class LayerInfo:
    """One layer's cache right after restore (before any prefill)."""

    index: int
    cache_class: str
    offset: Optional[int]  # None for caches without an offset (SSM / conv state)
    size: int  # tokens held (a ring holds at most its window)
    trimmable: bool

    @classmethod
    def from_dict(cls, d: dict[str, Any], index: int = 0) -> "LayerInfo":
        """Rebuild from `asdict` output; a missing key takes a neutral value (old stored rows)."""
        offset = d.get("offset")
        return cls(
            index=int(d.get("index", index)),
            cache_class=str(d.get("cache_class") or ""),
            offset=None if offset is None else int(offset),
            size=int(d.get("size") or 0),
            trimmable=bool(d.get("trimmable", False)),
        )


@dataclass
class ContextInfo:
    """How the conversation was fitted into the model's context."""

    limit: Optional[int]  # the model's context length in tokens (None: unknown)
    prompt_tokens: int  # of the prompt actually sent
    dropped_messages: int = 0  # oldest messages left out ("truncate" policy)


@dataclass
class CacheReport:
    """What the prompt cache did for one generation (the debug panel renders this)."""

    prompt_tokens: int = 0
    matched: int = 0  # longest common token prefix with any stored snapshot
    restored: int = 0  # tokens restored into the live cache (never the whole prompt)
    stored: Optional[int] = None  # length of the snapshot used, None if none
    snapshot_id: Optional[str] = None  # the snapshot used (None if none)
    partial: bool = False  # restored < stored (a trimmable cache was cut back)
    source: Optional[str] = None  # engine.cache.kinds.RestoreSource ("memory" | "disk"); None: cold
    layer_offsets: list[Optional[int]] = field(default_factory=list)
    layers: list[LayerInfo] = field(default_factory=list)
    declines: list[str] = field(default_factory=list)
    # tokens forwarded before decode, the last prompt token included; a run stopped before decode: those
    # it did forward (`chunks` lists them)
    prefill_tokens: int = 0
    chunks: list[list[int]] = field(default_factory=list)  # [start, end) of each prefill forward
    message_starts: list[int] = field(default_factory=list)  # message boundaries among the chunk cuts
    # cuts at the end of each earlier reply's generation header but its last token (G_i - 1:
    # where that turn's regenerate point ends; templating.MessageStarts.reply_header_cuts)
    reply_header_cuts: list[int] = field(default_factory=list)
    context: Optional[ContextInfo] = None
    snapshots_stored: list[dict[str, Any]] = field(default_factory=list)  # kind/length/canonical
    mode: str = "exact"
    chunk_size: int = 512
    sampler: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    ttft_s: float = 0.0
    prefill_tps: float = 0.0
    decode_tps: float = 0.0
    model_key: str = ""
    identical: Optional[bool] = None  # equal to the previous generation of the same prompt+settings
    first_diff: Optional[int] = None  # first differing token index when not identical
    warnings: list[str] = field(default_factory=list)  # e.g. "prompt cache disk full": shown once
    # A distributed run (engine/distributed/): the ranks, and what each rank's own cache did
    # ({rank, host, restored, source, stored, layer_offsets, declines}); the figures above are rank 0's.
    world_size: int = 1
    ranks: list[dict[str, Any]] = field(default_factory=list)
    # Each attached document: {name, digest, start, end, tokens, cut, source}: where it lies in the
    # prompt and where its state came from ("memory" | "disk": restored; "prefilled": computed now).
    documents: list[dict[str, Any]] = field(default_factory=list)
    # A Continue: tokens of the reply before it (0: not a continuation), the characters of its
    # text the continuation keeps (the new text follows them), and how the cache got there.
    continued_from: int = 0
    continued_chars: int = 0
    continue_note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Optional[dict[str, Any]]) -> "CacheReport":
        """Rebuild a report from `to_dict()` output (e.g. a stored row). Tolerant of old rows:
        unknown keys are ignored, missing ones (or a null where a value is expected) keep the
        default, and layers come back as `LayerInfo`."""
        d = d or {}
        kw: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in d:
                continue
            value = d[f.name]
            if value is None and f.default is not None:
                continue  # a null where the field has a non-null default (a list, a number)
            kw[f.name] = value
        kw["layers"] = [
            LayerInfo.from_dict(x, i) if isinstance(x, dict) else x for i, x in enumerate(d.get("layers") or [])
        ]
        ctx = d.get("context")
        kw["context"] = ContextInfo(ctx.get("limit"), int(ctx.get("prompt_tokens") or 0),
                                    int(ctx.get("dropped_messages") or 0)) if isinstance(ctx, dict) else None
        return cls(**kw)


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    seed: int
    prompt_ids: list[int]
    report: CacheReport
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)  # per token, when asked

    def to_dict(self) -> dict[str, Any]:
        """The CLI's `--json` object (a stable contract for scripts and tests)."""
        cache = self.report.to_dict()
        return {
            "text": self.text,
            "tokens": self.tokens,
            "logprobs": self.logprobs,
            "finish_reason": self.finish_reason,
            "seed": self.seed,
            "cache": cache,
            "context": cache["context"],  # {limit, prompt_tokens, dropped_messages}
            "timings": {k: cache[k] for k in ("ttft_s", "prefill_tps", "decode_tps")},
        }


def first_divergence(a_tokens: Sequence[int], b_tokens: Sequence[int], a_logprobs: Optional[Sequence[float]] = None,
                     b_logprobs: Optional[Sequence[float]] = None, start: int = 0,
                     b_ended: bool = True) -> Optional[tuple[int, str]]:
    """Where generation b first parts from a, looking from index `start` on: (index, why) with why
    "token" (another token), "logprob" (the same token, a logprob not bit-equal: only when both
    logprobs are given), "longer" (b goes on past a's end) or "shorter" (b ended first: only once
    `b_ended`); None while b agrees with a. The one definition of "the first divergent token":
    Comparison.of (tokens only) and a regenerate's replay (app/core/generation/replay.py, token by
    token as it streams) both use it."""
    for i in range(start, min(len(a_tokens), len(b_tokens))):
        if a_tokens[i] != b_tokens[i]:
            return i, "token"
        if a_logprobs is not None and b_logprobs is not None and a_logprobs[i] != b_logprobs[i]:
            return i, "logprob"
    if len(b_tokens) > len(a_tokens):
        return len(a_tokens), "longer"
    if b_ended and len(b_tokens) < len(a_tokens):
        return len(b_tokens), "shorter"
    return None


@dataclass
class Comparison:
    """Whether two generations (a, b) are the same, where they first differ and by how much.

    `first_diff` is the first token index where they differ (a token, or one of them ending
    earlier); `shared_tokens` the length of their common token prefix; `shared_chars` that of
    their common text prefix (when the texts were given). `max_logprob_diff` is the largest
    |delta logprob| over the shared prefix. `upto`: compared over the first `upto` tokens only
    (one side was stopped there), so "identical" means identical up to where it stopped.
    """

    identical: bool
    first_diff: Optional[int] = None  # index of the first differing token
    max_logprob_diff: float = 0.0
    detail: str = ""
    shared_tokens: int = 0
    shared_chars: Optional[int] = None
    lengths: tuple[int, int] = (0, 0)  # tokens of a and b
    upto: Optional[int] = None

    @classmethod
    def of(cls, a_tokens: list[int], a_lps: list[float], b_tokens: list[int], b_lps: list[float],
           a_text: Optional[str] = None, b_text: Optional[str] = None, shared_length: bool = False) -> "Comparison":
        """Compare a with b. `shared_length`: only over the shorter one's length (the other was
        stopped early: identical up to where it stopped)."""
        upto = min(len(a_tokens), len(b_tokens)) if shared_length else None
        ta, tb = (a_tokens[:upto], b_tokens[:upto]) if upto is not None else (a_tokens, b_tokens)
        parted = first_divergence(ta, tb)
        first = parted[0] if parted is not None else None
        shared = first if first is not None else len(ta)
        diff = max((abs(x - y) for x, y in zip(a_lps[:shared], b_lps[:shared])), default=0.0)
        identical = first is None and diff == 0.0
        chars = None
        if a_text is not None and b_text is not None:
            chars = next((i for i, (x, y) in enumerate(zip(a_text, b_text)) if x != y), min(len(a_text), len(b_text)))
        if identical:
            detail = f"identical ({len(ta)} tokens, bit-equal logprobs)"
            if upto is not None and len(a_tokens) != len(b_tokens):
                detail = f"identical up to where the first one stopped ({upto} tokens, bit-equal logprobs)"
        elif first is None:
            detail = f"same tokens, logprobs differ by up to {diff:.3g}"
        else:
            detail = f"first differing token at index {first}"
        return cls(identical, first, diff, detail, shared, chars, (len(a_tokens), len(b_tokens)), upto)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
