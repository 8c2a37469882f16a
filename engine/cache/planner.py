"""The exactness planner: which stored snapshot to restore, and how far, from metadata alone.

A snapshot is a deep, compact copy of the per-layer cache objects after some token prefix.
Three kinds are taken per generation (DESIGN.md):

- ``pre-last``: right after prefill, the cache holds ``prompt[:-1]``. A regenerate of the same
  prompt restores exactly this and forwards the last prompt token alone (G4), never the
  whole prompt (the classic whole-prompt-hit bug).
- ``end``: prompt + reply, for the next turn (fast mode reuses decoded tokens).
- ``boundary``: for caches that cannot be cut back (wrapped sliding window, SSM state), a copy
  taken during prefill at the last aligned boundary ``floor((len-1)/C)*C``: what exact mode
  reuses on the next turn for those families.

Exactness bookkeeping: prefill chunks are cut at absolute multiples of ``C``. The state after
position ``p`` equals a cold run's state (bit for bit) when ``p`` is a multiple of ``C`` reached
through full aligned chunks only (``canonical``), or when ``p`` is where an exact prefill ended
(``prefill_end``) and the new prompt ends one token later too (a whole-prompt hit).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence


@dataclass
class SnapshotMeta:
    """Everything about a snapshot except its arrays (what the disk index keeps)."""

    id: str
    model_key: str
    tokens: tuple[int, ...]
    kind: str  # "pre-last" | "end" | "boundary" | "partial"
    canonical: int  # state at multiples of C up to here equals a cold run's
    prefill_end: int  # where this snapshot's prompt prefill ended (len(prompt) - 1)
    prefill_exact: bool  # state at prefill_end equals a cold run's
    classes: tuple[str, ...]
    trimmable: bool
    nbytes: int

    @property
    def length(self) -> int:
        return len(self.tokens)


def cut_reason(classes: Sequence[str], length: int, target: int) -> str:
    """Why a snapshot with these cache classes cannot be cut back from `length` to `target`."""
    if "ArraysCache" in classes:
        return f"SSM/conv state: cannot cut {length} -> {target}"
    if "RotatingKVCache" in classes:
        return f"sliding window wrapped: cannot cut {length} -> {target}"
    return f"cache cannot be cut back: {length} -> {target}"



def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass
class Plan:
    """What to restore: a snapshot cut back (or not) to `reuse` tokens."""

    meta: Optional[SnapshotMeta] = None
    source: Optional[str] = None
    reuse: int = 0
    matched: int = 0
    declines: list[str] = field(default_factory=list)


def exact_at(meta: SnapshotMeta, reuse: int, prompt_len: int, chunk: int) -> bool:
    """Does the snapshot's state after `reuse` tokens equal a cold run's, for a prompt of
    `prompt_len` tokens? (An aligned boundary reached in full chunks, or a whole-prompt hit on
    an exact prefill: see the module docstring.)"""
    return (
        reuse == 0
        or (reuse % chunk == 0 and reuse <= meta.canonical)
        or (meta.prefill_exact and reuse == meta.prefill_end == prompt_len - 1)
    )


def reuse_point(meta: SnapshotMeta, matched: int, prompt_len: int, mode: str, chunk: int) -> int:
    """The longest prefix of `meta` that may be restored for a prompt of `prompt_len` tokens.

    `matched` is the common prefix with the prompt, already capped at prompt_len - 1 so that
    the last prompt token is always forwarded, alone. Exact mode: the longest exact point.
    """
    if mode == "fast" or exact_at(meta, matched, prompt_len, chunk):
        return matched
    return min(matched // chunk * chunk, meta.canonical // chunk * chunk)


def plan_restore(
    candidates: Sequence[tuple[SnapshotMeta, str]],
    prompt: Sequence[int],
    mode: str,
    chunk: int,
) -> Plan:
    """Pick the snapshot giving the longest usable restore; say why better-matching ones lost."""
    limit = len(prompt) - 1
    head = list(prompt[:limit])
    options: list[tuple[int, int, SnapshotMeta, str, int, Optional[str]]] = []
    for meta, source in candidates:
        matched = common_prefix(meta.tokens, head)
        if matched == 0:
            continue
        reuse = reuse_point(meta, matched, len(prompt), mode, chunk)
        problem = None
        if reuse < meta.length and not meta.trimmable:
            problem = f"{meta.kind} snapshot: " + cut_reason(meta.classes, meta.length, reuse)
            usable = 0
        else:
            usable = reuse
        # Ties: memory before disk, then the smallest snapshot (least to copy and cut).
        options.append((usable, 1 if source == "memory" else 0, meta, source, matched, problem))
    plan = Plan()
    if not options:
        return plan
    options.sort(key=lambda o: (o[0], o[1], -o[2].length), reverse=True)
    best = options[0]
    if best[0] > 0:
        plan.meta, plan.source, plan.reuse = best[2], best[3], best[0]
    plan.matched = max(o[4] for o in options)
    for _, _, meta, _, matched, problem in options:
        if problem and matched > plan.reuse and meta is not plan.meta:
            plan.declines.append(problem)
    return plan


def dominates(a: SnapshotMeta, b: SnapshotMeta) -> bool:
    """True if `a` can serve every restore `b` could (so `b` may be dropped)."""
    if a.tokens == b.tokens and a.canonical >= b.canonical and a.prefill_exact >= b.prefill_exact:
        return True  # the same state again (a regenerate's snapshots): keep the newer copy
    if not a.trimmable or a.length < b.length or a.tokens[: b.length] != b.tokens:
        return False
    if a.canonical < b.canonical:
        return False
    if b.prefill_exact and not (a.prefill_exact and a.prefill_end == b.prefill_end):
        return False
    return True
