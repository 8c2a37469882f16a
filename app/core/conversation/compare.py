"""Two replies of the same prompt side by side, token by token (no Qt): what the compare view shows.

A `Side` is one reply as stored (tokens, logprobs bit for bit, text, how it was made) or a
cold run of it; `CompareData` aligns two sides by token index around the engine's `Comparison`
(first divergence, shared prefix in tokens and characters, max |delta logprob|) and gives the
compare view its rows and plot series. The words are in view_models (compare_verdict, side_text).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from app.core.store import Message
from engine.types import Comparison, GenerationResult


@dataclass(frozen=True)
class Side:
    label: str  # "Reply 1 / 3", "Cold run of reply 1 / 3"
    tokens: list[int]
    logprobs: list[float]
    text: str = ""
    pieces: Optional[list[str]] = None  # the text of each token, when the model could decode them
    seed: Optional[int] = None
    mode: str = "exact"
    sampler: dict[str, Any] = field(default_factory=dict)
    source: Optional[str] = None  # where its prompt came from: "memory" | "disk" | None (cold)
    restored: int = 0
    prompt_tokens: int = 0
    status: str = "complete"
    message_id: Optional[int] = None

    @classmethod
    def of_message(cls, m: Message, label: str) -> "Side":
        r = m.report
        return cls(label, list(m.tokens or []), list(m.logprobs or []), m.content, None, m.seed,
                   r.mode if r else "exact", dict(m.sampler or {}), r.source if r else None,
                   r.restored if r else 0, r.prompt_tokens if r else 0, m.status, m.id)

    @classmethod
    def of_result(cls, result: GenerationResult, label: str, mode: str, sampler: dict[str, Any]) -> "Side":
        r = result.report
        return cls(label, list(result.tokens), list(result.logprobs), result.text, None, result.seed, mode,
                   dict(sampler), r.source, r.restored, r.prompt_tokens,
                   "interrupted" if result.finish_reason == "cancelled" else "complete")

    def piece(self, i: int) -> str:
        if self.pieces is not None and i < len(self.pieces):
            return self.pieces[i]
        return f"#{self.tokens[i]}"


@dataclass(frozen=True)
class Row:
    index: int
    a: Optional[tuple[int, str, float]]  # (token id, text, logprob), None past its end
    b: Optional[tuple[int, str, float]]
    delta: Optional[float]  # |delta logprob| where both have a token
    same: bool  # the same token at this index


@dataclass
class CompareData:
    a: Side
    b: Side
    comparison: Comparison

    @property
    def rows(self) -> int:
        return max(len(self.a.tokens), len(self.b.tokens))

    def row(self, i: int) -> Row:
        def cell(s: Side) -> Optional[tuple[int, str, float]]:
            return (s.tokens[i], s.piece(i), s.logprobs[i]) if i < len(s.tokens) else None

        a, b = cell(self.a), cell(self.b)
        delta = abs(a[2] - b[2]) if a is not None and b is not None else None
        return Row(i, a, b, delta, a is not None and b is not None and a[0] == b[0])

    def deltas(self) -> list[float]:
        """|delta logprob| per index where both sides have a token (plotted under the logprobs)."""
        return [abs(x - y) for x, y in zip(self.a.logprobs, self.b.logprobs)]

    def logprob_range(self) -> tuple[float, float]:
        """(lowest, highest) finite logprob of both sides, for the plot's axis."""
        values = [x for x in self.a.logprobs + self.b.logprobs if math.isfinite(x)]
        return (min(values), max(values)) if values else (-1.0, 0.0)


def compare(a: Side, b: Side) -> CompareData:
    """Align two sides. When one was stopped, it is still compared in full: the verdict says one
    ends where it stopped (the badge's 'identical up to where it stopped' is the session's)."""
    return CompareData(a, b, Comparison.of(a.tokens, a.logprobs, b.tokens, b.logprobs, a.text, b.text))
