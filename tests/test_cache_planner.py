"""The exactness planner on hand-made metadata: what may be restored, how far, and which
snapshot may replace another (engine/cache/planner.py). No model: each case is one fact."""

from __future__ import annotations

from engine.cache.planner import SnapshotMeta, dominates, exact_at, plan_restore, reuse_point

C = 8


def meta(tokens, canonical, prefill_end, prefill_exact, trimmable=True, kind="end", sid="s") -> SnapshotMeta:
    return SnapshotMeta(sid, "k", tuple(tokens), kind, canonical, prefill_end, prefill_exact,
                        ("KVCache",), trimmable, 1)


PROMPT = list(range(1, 30))  # 29 tokens: prefill ends at 28, the last aligned boundary is 24


def test_exact_at_only_aligned_boundaries_computed_in_full_chunks_or_the_prefill_end():
    exact = meta(PROMPT[:-1], canonical=24, prefill_end=28, prefill_exact=True)
    assert exact_at(exact, 0, 29, C)
    assert exact_at(exact, 16, 29, C) and exact_at(exact, 24, 29, C)
    assert not exact_at(exact, 20, 29, C)  # unaligned
    assert exact_at(exact, 28, 29, C)  # a whole-prompt hit on an exact prefill
    assert not exact_at(exact, 28, 30, C)  # the same point for a longer prompt is mid-chunk there
    fast = meta(PROMPT[:-1], canonical=16, prefill_end=28, prefill_exact=False)
    assert not exact_at(fast, 24, 29, C)  # past what this snapshot computed in full chunks
    assert not exact_at(fast, 28, 29, C)  # its prefill was not exact: no whole-prompt hit


def test_reuse_point_exact_mode_falls_back_to_the_canonical_boundary():
    fast = meta(PROMPT + [90, 91, 92], canonical=16, prefill_end=28, prefill_exact=False)
    assert reuse_point(fast, 28, 29, "fast", C) == 28
    assert reuse_point(fast, 28, 29, "exact", C) == 16
    exact = meta(PROMPT + [90, 91, 92], canonical=24, prefill_end=28, prefill_exact=True)
    assert reuse_point(exact, 28, 29, "exact", C) == 28
    assert reuse_point(exact, 27, 40, "exact", C) == 24


def test_plan_never_restores_the_whole_prompt():
    snap = meta(PROMPT + [90, 91], canonical=24, prefill_end=28, prefill_exact=True)
    plan = plan_restore([(snap, "memory")], PROMPT, "fast", C)
    assert plan.meta is snap and plan.reuse == len(PROMPT) - 1


def test_plan_declines_cutting_what_cannot_be_cut():
    ring = meta(PROMPT + [90, 91], canonical=24, prefill_end=28, prefill_exact=True, trimmable=False, sid="ring")
    plan = plan_restore([(ring, "disk")], PROMPT, "fast", C)
    assert plan.meta is None and plan.reuse == 0 and plan.declines and "cannot be cut back: 31 -> 28" in plan.declines[0]


def test_dominates_keeps_exact_states():
    exact = meta(PROMPT[:-1], canonical=24, prefill_end=28, prefill_exact=True, sid="a")
    longer_fast = meta(PROMPT + [90, 91], canonical=16, prefill_end=40, prefill_exact=False, sid="b")
    longer_exact = meta(PROMPT + [90, 91], canonical=24, prefill_end=28, prefill_exact=True, sid="c")
    assert not dominates(longer_fast, exact)  # lower canonical, and its prefill was not exact
    assert dominates(longer_exact, exact)  # a trimmable superset computed the same way
    assert not dominates(exact, longer_exact)  # shorter
    same_fast = meta(PROMPT[:-1], canonical=24, prefill_end=28, prefill_exact=False, sid="d")
    assert not dominates(same_fast, exact) and dominates(exact, same_fast)
    untrimmable = meta(PROMPT + [90, 91], canonical=24, prefill_end=28, prefill_exact=True, trimmable=False, sid="e")
    assert not dominates(untrimmable, exact)  # cannot be cut back to serve it
    other_end = meta(PROMPT + [90, 91], canonical=24, prefill_end=30, prefill_exact=True, sid="f")
    assert not dominates(other_end, exact)  # exact at 30, not at 28
    partial = meta(PROMPT[:24], canonical=24, prefill_end=28, prefill_exact=False, kind="partial", sid="g")
    lower = meta(PROMPT + [90, 91], canonical=16, prefill_end=40, prefill_exact=False, sid="h")
    assert not dominates(lower, partial)  # exact up to 16 only: it cannot serve a restore at 24
    assert dominates(longer_exact, partial)
