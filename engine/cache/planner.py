"""The exactness planner: which stored snapshot to restore, and how far, from metadata alone.

The canonical schedule. A cold run of a prompt of n tokens forwards it in chunks cut at
absolute multiples of C, at every message boundary (where a rendered message starts, and where
the generation prompt starts), at every reply header cut (the end of each earlier reply's
generation header but its last token: G_i - 1, where G_i is turn i's own prompt length), and
before the last token, which goes alone. `schedule_cuts()` gives those cut positions (the last
is n - 1). Two runs that forward the same chunks from position 0 have bit-identical states at
every cut, whatever the BLAS does with the width.

Exactness. A snapshot records `exact_cuts`: the cuts of its own history up to which every
forward followed a canonical schedule. Its state at a cut r equals a cold run's state for a new
prompt exactly when r is also a cut of the new prompt's schedule and both schedules made the
same cuts before r (`exact_at`). Exact mode restores only such points; fast mode restores the
longest common prefix. Message boundaries and reply header cuts are what make exact mode cheap:
turn N forwarded its generation header as [start of header, n_N - 1), then token n_N - 1 alone;
turn N + 1 renders the same header before turn N's reply and cuts at n_N - 1 too, so it shares
turn N's cuts up to n_N - 1 (turn N's regenerate point, bit for bit, and on disk the same
blocks) and only the previous reply, the new message and the new header are prefilled again.

Snapshot kinds, taken per generation:

- ``pre-last``: after prefill, the cache holds ``prompt[:-1]``. A regenerate of the same prompt
  restores exactly this and forwards the last prompt token alone (G4), never the whole prompt
  (the classic whole-prompt-hit bug).
- ``end``: prompt + reply, for the next turn (fast mode reuses decoded tokens; exact mode cuts
  it back to the last message boundary).
- ``boundary``: for caches that cannot be cut back (wrapped sliding window, SSM state), a copy
  taken during prefill at the last cut before n - 1: what exact mode reuses on the next turn.
- ``partial``: a prefill stopped at an exact cut; also a prefix read back from disk (a restore
  that needs fewer tokens than the snapshot holds, or whose later blocks another instance deleted).
- ``document``: the state holding attached documents: at each document's end that is a cut, and
  where the system message after the last one ends (Engine's `_document_points`); eviction keeps
  it ahead of the other kinds while a conversation holds its documents (eviction.py).

The kinds are `kinds.SnapshotKind`, a StrEnum: on disk and in reports they are these strings.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Optional, Sequence

from engine.cache.families import cut_reason
from engine.cache.kinds import RestoreSource, SnapshotKind
from engine.cache.meta import SnapshotMeta
from engine.types import Mode


def schedule_cuts(n_prompt: int, chunk: int, message_starts: Sequence[int] = (),
                  reply_header_cuts: Sequence[int] = ()) -> tuple[int, ...]:
    """The canonical schedule's cut positions for a prompt of `n_prompt` tokens (ends with n - 1):
    multiples of `chunk`, `message_starts` and `reply_header_cuts` (templating.MessageStarts)
    inside (0, n - 1), and n - 1."""
    last = n_prompt - 1
    cuts = set(range(chunk, last, chunk))
    cuts.update(m for m in message_starts if 0 < m < last)
    cuts.update(h for h in reply_header_cuts if 0 < h < last)
    cuts.add(last)
    return tuple(sorted(c for c in cuts if c > 0))


def chunks(start: int, cuts: Sequence[int]) -> list[tuple[int, int]]:
    """The forwards that take the cache from `start` (a cut, or 0) to the last cut."""
    out, pos = [], start
    for c in cuts:
        if c > pos:
            out.append((pos, c))
            pos = c
    return out


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
    source: Optional[RestoreSource] = None
    reuse: int = 0
    matched: int = 0
    declines: list[str] = field(default_factory=list)


def exact_at(meta: SnapshotMeta, reuse: int, cuts: Sequence[int]) -> bool:
    """Does the snapshot's state after `reuse` tokens equal a cold run's for a prompt whose
    schedule is `cuts`? Yes at 0, and at a cut both schedules share with the same cuts before it."""
    if reuse == 0:
        return True
    if reuse not in meta.exact_cuts:
        return False
    mine = meta.exact_cuts[: meta.exact_cuts.index(reuse) + 1]
    return mine == tuple(c for c in cuts if c <= reuse)


def decoded_alone(meta: SnapshotMeta, start: int, reuse: int) -> bool:
    """Were positions [start, reuse) of `meta` each forwarded alone (decode steps), and did
    nothing before `start` reach past it? (False when the history is unknown.)"""
    if not meta.forwards:
        return False
    tail = [f for f in meta.forwards if start <= f[0] < reuse]
    before_ok = all(e <= start for s, e in meta.forwards if s < start)
    return before_ok and tail == [(p, p + 1) for p in range(start, reuse)]


def exact_tail_at(meta: SnapshotMeta, reuse: int, cuts: Sequence[int], singles_from: Optional[int]) -> bool:
    """A Continue's exactness: the state after `reuse` tokens equals the unstopped run's when the
    snapshot is exact at `singles_from` (the reply's prompt but its last token, a cut of both)
    and every position from there to `reuse` was decoded alone, as the unstopped run did."""
    if singles_from is None or reuse <= singles_from:
        return False
    return exact_at(meta, singles_from, cuts) and decoded_alone(meta, singles_from, reuse)


def reuse_point(meta: SnapshotMeta, matched: int, mode: Mode, cuts: Sequence[int],
                singles_from: Optional[int] = None) -> int:
    """The longest prefix of `meta` that may be restored for a prompt with schedule `cuts`.

    `matched` is the common prefix with the prompt, already capped at prompt_len - 1 so that
    the last prompt token is always forwarded, alone. Exact mode: the longest exact point.
    `singles_from`: a Continue (the prompt ends with the reply so far, decoded one token per
    forward from this position on): a decoded tail that matches is exact too (`exact_tail_at`).
    """
    if mode == "fast":
        return matched
    if exact_tail_at(meta, matched, cuts, singles_from):
        return matched
    return max((c for c in (matched, *meta.exact_cuts) if c <= matched and exact_at(meta, c, cuts)), default=0)


DISK_SLACK = 64  # tokens a disk restore must add over a memory one to be read (forwarding them costs less)


def plan_restore(
    candidates: Sequence[tuple[SnapshotMeta, RestoreSource]],
    prompt: Sequence[int],
    mode: Mode,
    cuts: Sequence[int],
    singles_from: Optional[int] = None,
    ready: Optional[str] = None,
) -> Plan:
    """Pick the snapshot giving the longest usable restore; say why better-matching ones lost.
    `ready`: the id of the snapshot whose restored copy is at hand (PromptCache's spare: no copy
    to make), which wins a tie."""
    limit = len(prompt) - 1
    head = list(prompt[:limit])
    options: list[_Option] = []
    for meta, source in candidates:
        matched = common_prefix(meta.tokens, head)
        if matched == 0:
            continue
        reuse = reuse_point(meta, matched, mode, cuts, singles_from)
        problem = None
        if reuse < meta.length and not meta.trimmable:
            problem = f"{meta.kind} snapshot: " + cut_reason(meta.classes, meta.length, reuse)
            usable = 0
        else:
            usable = reuse
        options.append(_Option(usable, meta, source, matched, problem))
    plan = Plan()
    if not options:
        return plan
    # Ties: memory before disk, then the copy at hand, then the smallest snapshot (least to copy and cut).
    options.sort(key=lambda o: (o.usable, o.source == RestoreSource.MEMORY, o.meta.id == ready, -o.meta.length), reverse=True)
    best = options[0]
    if best.source == RestoreSource.DISK and best.usable < limit:
        # A few tokens more from the disk are not worth reading it: a memory snapshot nearly as
        # long wins (a document's state, read ahead at start, against a conversation's end a
        # header longer). Never for a regenerate: a restore of all but the last token stays one.
        near = [o for o in options if o.source == RestoreSource.MEMORY and o.usable > 0 and best.usable - o.usable <= DISK_SLACK]
        if near:
            best = near[0]
    if best.usable > 0:
        plan.meta, plan.source, plan.reuse = best.meta, best.source, best.usable
    plan.matched = max(o.matched for o in options)
    for o in options:
        if o.problem and o.matched > plan.reuse and o.meta is not plan.meta:
            plan.declines.append(o.problem)
    return plan


class _Option(NamedTuple):
    """One candidate as plan_restore weighs it."""

    usable: int  # tokens it may restore (0: it cannot be cut back to its reuse point)
    meta: SnapshotMeta
    source: RestoreSource
    matched: int  # its common prefix with the prompt
    problem: Optional[str]  # why it cannot be restored as far as it matches (a decline)


def dominates(a: SnapshotMeta, b: SnapshotMeta) -> bool:
    """True if `a` can serve every restore `b` could (so `b` may be dropped): the same tokens, or
    a trimmable extension of them, with `b`'s exact history as a prefix of `a`'s. A document's
    snapshot is dominated only by another one: it is what eviction keeps (cache/eviction.py),
    and over shared blocks it costs its manifest alone."""
    if b.kind == SnapshotKind.DOCUMENT and a.kind != SnapshotKind.DOCUMENT:
        return False
    if a.exact_cuts[: len(b.exact_cuts)] != b.exact_cuts:
        return False
    if a.tokens == b.tokens:
        return True  # the same state again (a regenerate's snapshots): keep the newer copy
    return a.trimmable and a.length >= b.length and a.tokens[: b.length] == b.tokens
