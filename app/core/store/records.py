"""Rows of the conversation store and how they are encoded in SQLite (no SQL here but the row mapping).

Reports are stored as JSON in one column: the engine's `CacheReport.to_dict()` merged with the
session's `ReplyOutcome.to_dict()`; `Message.report` / `Message.outcome` rebuild them typed.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from array import array
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Optional, Sequence

from engine.types import CacheReport, Comparison, GenerationResult

DB_NAME = "verbatim.sqlite3"
APPLICATION_ID = 0x56425442  # "VBTB": tells our file apart from any other SQLite database
STATUSES = ("complete", "generating", "interrupted")
ASSISTANT_FIELDS = (
    "seed", "sampler", "model_key", "model_name", "tokens", "logprobs",
    "finish_reason", "cache_report", "timings",
)  # fmt: skip
_JSON_FIELDS = ("sampler", "cache_report", "timings")
EXPORT_FORMAT = "verbatim.conversation"
# Message fields written to JSON as they are; ids are replaced by file-local ones.
_EXPORTED_FIELDS = ("role", "content", "created_at", "status", *ASSISTANT_FIELDS)
EXPORT_VERSION = 1


class StoreError(Exception):
    """Anything the user should be told about the store (corrupt file, newer schema, read-only...)."""


class Action(StrEnum):
    """Why a reply was made (stored with each run: the report's "action"). A StrEnum: the stored
    text is the value, and a value compares equal to its text."""

    SEND = "send"  # the answer to a message just sent
    REGENERATE = "regenerate"  # a reply again, with its own seed and settings: it must come out the same
    VARIANT = "variant"  # a new variant: a fresh seed and the conversation's current settings
    EDIT = "edit"  # the answer to an edited message (a branch)
    RETRY = "retry"  # the answer to a message left without one (its generation failed)
    CONTINUE = "continue"  # a stopped reply (or one at max tokens), gone on with in place
    NONE = ""  # rows from before the action was recorded

    @classmethod
    def of(cls, value: Any) -> "Action":
        """The action a stored text names (NONE for anything else)."""
        try:
            return cls(str(value or ""))
        except ValueError:
            return cls.NONE


def continuable(status: str, finish_reason: Optional[str], n_tokens: int) -> bool:
    """Whether Continue applies: a reply with tokens that was stopped, or that ended at max tokens."""
    return n_tokens > 0 and (status == "interrupted" or (status == "complete" and finish_reason == "length"))


# --------------------------------------------------------------------------- rows


@dataclass
class Conversation:
    id: int
    title: str
    created_at: float  # unix seconds
    updated_at: float
    settings: dict[str, Any] = field(default_factory=dict)  # system_prompt, sampler, mode, model
    active_root_id: Optional[int] = None


@dataclass
class Message:
    id: int
    conversation_id: int
    parent_id: Optional[int]
    role: str
    content: str
    created_at: float
    status: str = "complete"  # "complete" | "generating" | "interrupted"
    active_child_id: Optional[int] = None
    # Assistant replies (None elsewhere):
    seed: Optional[int] = None
    sampler: Optional[dict[str, Any]] = None
    model_key: Optional[str] = None
    model_name: Optional[str] = None
    tokens: Optional[list[int]] = None
    logprobs: Optional[list[float]] = None  # bit-exact (stored as float64)
    finish_reason: Optional[str] = None
    cache_report: Optional[dict[str, Any]] = None  # CacheReport.to_dict() | ReplyOutcome.to_dict()
    timings: Optional[dict[str, Any]] = None

    @property
    def report(self) -> Optional[CacheReport]:
        """The engine's report for this reply, typed (None when nothing was generated yet)."""
        return CacheReport.from_dict(self.cache_report) if self.cache_report else None

    @property
    def outcome(self) -> "ReplyOutcome":
        return ReplyOutcome.from_dict(self.cache_report)

    def as_result(self) -> GenerationResult:
        """The stored reply as the engine's result (what verify and a receipt compare against)."""
        finish = self.finish_reason or ("cancelled" if self.status == "interrupted" else "stop")
        seed = self.seed if self.seed is not None else int((self.sampler or {}).get("seed") or 0)
        return GenerationResult(self.content, list(self.tokens or []), list(self.logprobs or []), finish,  # type: ignore[arg-type]
                                seed, [], self.report or CacheReport())


@dataclass(frozen=True)
class ReplyOutcome:
    """What the chat session adds to the engine's report: why a reply was made and how it compares
    with the variant it was made to replace. Stored flat in the same JSON column as the report
    (keys action, previous_id, identical, first_diff, max_logprob_diff, as it always was; upto
    when a stopped reply was compared over its length)."""

    action: Action = Action.NONE
    previous_id: Optional[int] = None
    comparison: Optional[Comparison] = None  # None: nothing to compare with
    # A regenerate identical to an existing variant is not added: the variant it equals (never
    # stored, the new row is dropped; the debug panel shows the run).
    duplicate_of: Optional[int] = None
    # (the previous variant's, this one's) world size when they differ: ranks sum in another
    # order, so the logprobs may differ for that reason alone.
    world_sizes: Optional[tuple[int, int]] = None

    def to_dict(self) -> dict[str, Any]:
        c = self.comparison
        d: dict[str, Any] = {
            "action": str(self.action),
            "previous_id": self.previous_id,
            "identical": None if c is None else c.identical,
            "first_diff": None if c is None else c.first_diff,
            "max_logprob_diff": None if c is None else c.max_logprob_diff,
        }
        if c is not None and c.upto is not None:
            d["upto"] = c.upto
            d["lengths"] = list(c.lengths)  # which one was stopped (the shorter)
        if self.duplicate_of is not None:
            d["duplicate_of"] = self.duplicate_of
        if self.world_sizes is not None:
            d["world_sizes"] = list(self.world_sizes)
        return d

    @classmethod
    def from_dict(cls, d: Optional[dict[str, Any]]) -> "ReplyOutcome":
        d = d or {}
        comparison = None
        if d.get("identical") is not None:
            upto = d.get("upto")
            lengths = d.get("lengths")
            ok = isinstance(lengths, list) and len(lengths) == 2 and all(isinstance(n, int) for n in lengths)
            comparison = Comparison(bool(d["identical"]), d.get("first_diff"), float(d.get("max_logprob_diff") or 0.0),
                                    lengths=(lengths[0], lengths[1]) if ok else (0, 0),  # type: ignore[index]
                                    upto=upto if isinstance(upto, int) else None)
        previous = d.get("previous_id")
        dup = d.get("duplicate_of")
        ws = d.get("world_sizes")
        sizes = (ws[0], ws[1]) if isinstance(ws, list) and len(ws) == 2 and all(isinstance(n, int) for n in ws) else None
        return cls(Action.of(d.get("action")), previous if isinstance(previous, int) else None, comparison,
                   dup if isinstance(dup, int) else None, sizes)


@dataclass(frozen=True)
class Run:
    """One generation of a reply: its first, or a regenerate that came out identical to it (which
    adds no copy of the message, only this run). The report says what the cache did that time;
    the outcome how it compared; tokens and logprobs are the message's (identical by definition)."""

    id: int
    message_id: int
    created_at: float
    seed: Optional[int]
    finish_reason: Optional[str]
    n_tokens: int
    report: CacheReport
    outcome: "ReplyOutcome"

    @property
    def mode(self) -> str:
        return self.report.mode

    @property
    def action(self) -> Action:
        return self.outcome.action

    @classmethod
    def of_message(cls, m: "Message") -> Optional["Run"]:
        """The run a reply's own row describes (rows imported, or from before runs were kept)."""
        if not m.cache_report or m.cache_report.get("streamed"):  # saved mid-reply: not a finished run
            return None
        return cls(0, m.id, m.created_at, m.seed, m.finish_reason, len(m.tokens or []), CacheReport.from_dict(m.cache_report),
                   ReplyOutcome.from_dict(m.cache_report))


@dataclass(frozen=True)
class VariantPosition:
    """Where a message sits among its siblings; str() gives the "2 / 3" the GUI shows."""

    index: int  # 1-based
    count: int

    def __str__(self) -> str:
        return f"{self.index} / {self.count}"


@dataclass
class SearchHit:
    conversation: Conversation
    message_id: Optional[int]  # first matching message, None when only the title matched
    snippet: str


# --------------------------------------------------------------------------- encoding

_LE = sys.byteorder == "little"


def _pack(values: Optional[Sequence[Any]], code: str) -> Optional[bytes]:
    """Lists as little-endian blobs: int32 token ids, float64 logprobs (exact, NaN/inf safe)."""
    if values is None:
        return None
    a = array(code, values)
    if not _LE:
        a.byteswap()
    return a.tobytes()


def _unpack(blob: Optional[bytes], code: str) -> Optional[list[Any]]:
    if blob is None:
        return None
    a = array(code)
    a.frombytes(blob)
    if not _LE:
        a.byteswap()
    return a.tolist()


def _dump(value: Any) -> Optional[str]:
    return None if value is None else json.dumps(value, sort_keys=True)


def _load(text: Optional[str]) -> Any:
    return None if text is None else json.loads(text)


def _conversation(row: sqlite3.Row) -> Conversation:
    return Conversation(
        row["id"], row["title"], row["created_at"], row["updated_at"],
        json.loads(row["settings"]), row["active_root_id"],
    )  # fmt: skip


def _message(row: sqlite3.Row) -> Message:
    return Message(
        id=row["id"], conversation_id=row["conversation_id"], parent_id=row["parent_id"],
        role=row["role"], content=row["content"], created_at=row["created_at"],
        status=row["status"], active_child_id=row["active_child_id"], seed=row["seed"],
        sampler=_load(row["sampler"]), model_key=row["model_key"], model_name=row["model_name"],
        tokens=_unpack(row["tokens"], "i"), logprobs=_unpack(row["logprobs"], "d"),
        finish_reason=row["finish_reason"], cache_report=_load(row["cache_report"]),
        timings=_load(row["timings"]),
    )  # fmt: skip


def _run(row: sqlite3.Row) -> Run:
    return Run(row["id"], row["message_id"], row["created_at"], row["seed"], row["finish_reason"], row["n_tokens"],
               CacheReport.from_dict(json.loads(row["report"])), ReplyOutcome.from_dict(json.loads(row["outcome"])))


def _encode_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """Assistant fields as column values; unknown names are a programming error."""
    unknown = set(fields) - set(ASSISTANT_FIELDS)
    if unknown:
        raise TypeError(f"unknown message field(s): {', '.join(sorted(unknown))}")
    out: dict[str, Any] = {}
    for k, v in fields.items():
        if k == "tokens":
            out[k] = _pack(v, "i")
        elif k == "logprobs":
            out[k] = _pack(v, "d")
        elif k in _JSON_FIELDS:
            out[k] = _dump(v)
        else:
            out[k] = v
    return out


def assistant_fields_from_result(result: Any, outcome: Optional[ReplyOutcome] = None) -> dict[str, Any]:
    """The assistant fields of an engine `GenerationResult`; the report column is where JSON
    appears (CacheReport.to_dict, plus the session's ReplyOutcome when given)."""
    report = result.report.to_dict()
    if outcome is not None:
        report.update(outcome.to_dict())
    return {
        "seed": result.seed,
        "sampler": report.get("sampler"),
        "model_key": report.get("model_key") or None,
        "tokens": list(result.tokens),
        "logprobs": list(result.logprobs),
        "finish_reason": result.finish_reason,
        "cache_report": report,
        "timings": {k: report.get(k) for k in ("ttft_s", "prefill_tps", "decode_tps")},
    }


