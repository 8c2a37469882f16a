"""The exactness planner on hand-made metadata: what may be restored, how far, and which
snapshot may replace another (engine/cache/planner.py). No model: each case is one fact."""

from __future__ import annotations

from engine.cache.planner import (
    SnapshotMeta,
    chunks,
    dominates,
    exact_at,
    plan_restore,
    reuse_point,
    schedule_cuts,
)

C = 8
PROMPT = list(range(1, 30))  # 29 tokens; one message starts at 5
CUTS = schedule_cuts(29, C, [5])


def meta(tokens, exact_cuts, trimmable=True, kind="end", sid="s") -> SnapshotMeta:
    return SnapshotMeta(sid, "k", tuple(tokens), kind, tuple(exact_cuts), ("KVCache",), trimmable, 1)


def test_schedule_cuts_multiples_of_c_message_starts_and_the_last_token():
    assert CUTS == (5, 8, 16, 24, 28)
    assert schedule_cuts(29, C) == (8, 16, 24, 28)
    assert schedule_cuts(30, 512, [5, 12, 29, 40, 0]) == (5, 12, 29)  # starts outside (0, n - 1) ignored
    assert schedule_cuts(1, C) == ()  # a one-token prompt: that token goes alone, nothing before it
    assert chunks(0, CUTS) == [(0, 5), (5, 8), (8, 16), (16, 24), (24, 28)]
    assert chunks(16, CUTS) == [(16, 24), (24, 28)]


def test_exact_at_only_where_both_schedules_made_the_same_cuts():
    cold_history = meta(PROMPT[:-1], CUTS)
    assert exact_at(cold_history, 0, CUTS)
    assert exact_at(cold_history, 16, CUTS) and exact_at(cold_history, 28, CUTS)
    assert not exact_at(cold_history, 20, CUTS)  # not a cut
    assert not exact_at(cold_history, 16, schedule_cuts(29, C, [3]))  # cut at 3 before 16, not at 5
    fast = meta(PROMPT[:-1], (5, 8))  # exact only as far as its source was
    assert exact_at(fast, 8, CUTS) and not exact_at(fast, 16, CUTS) and not exact_at(fast, 28, CUTS)


def test_reuse_point_exact_mode_falls_back_to_the_last_shared_cut():
    fast = meta(PROMPT + [90, 91, 92], (5, 8, 16))
    assert reuse_point(fast, 28, "fast", CUTS) == 28
    assert reuse_point(fast, 28, "exact", CUTS) == 16
    exact = meta(PROMPT + [90, 91, 92], CUTS)
    assert reuse_point(exact, 28, "exact", CUTS) == 28
    assert reuse_point(exact, 27, "exact", CUTS) == 24


def test_plan_never_restores_the_whole_prompt():
    snap = meta(PROMPT + [90, 91], CUTS)
    plan = plan_restore([(snap, "memory")], PROMPT, "fast", CUTS)
    assert plan.meta is snap and plan.reuse == len(PROMPT) - 1


def test_plan_declines_cutting_what_cannot_be_cut():
    ring = meta(PROMPT + [90, 91], CUTS, trimmable=False, sid="ring")
    plan = plan_restore([(ring, "disk")], PROMPT, "fast", CUTS)
    assert plan.meta is None and plan.reuse == 0
    assert plan.declines == ["end snapshot: cache cannot be cut back: 31 -> 28"]


def test_dominates_keeps_exact_states():
    exact = meta(PROMPT[:-1], CUTS, sid="a")
    longer_fast = meta(PROMPT + [90, 91], (5, 8), sid="b")
    longer_exact = meta(PROMPT + [90, 91], CUTS, sid="c")
    assert not dominates(longer_fast, exact)  # exact only up to 8: cannot serve a restore at 28
    assert dominates(longer_exact, exact)  # a trimmable superset with the same history
    assert not dominates(exact, longer_exact)  # shorter
    same_fast = meta(PROMPT[:-1], (5, 8), sid="d")
    assert not dominates(same_fast, exact) and dominates(exact, same_fast)
    untrimmable = meta(PROMPT + [90, 91], CUTS, trimmable=False, sid="e")
    assert not dominates(untrimmable, exact)  # cannot be cut back to serve it
    other_history = meta(PROMPT + [90, 91], schedule_cuts(29, C, [3]), sid="f")
    assert not dominates(other_history, exact)  # cut elsewhere: other bits at 8, 16, ...


def test_plan_prefers_the_longest_usable_restore_then_memory():
    ring = meta(PROMPT + [90, 91], CUTS, trimmable=False, sid="ring")
    boundary = meta(PROMPT[:24], (5, 8, 16, 24), trimmable=False, kind="boundary", sid="b")
    plan = plan_restore([(ring, "memory"), (boundary, "disk")], PROMPT, "exact", CUTS)
    assert plan.meta is boundary and plan.reuse == 24 and plan.source == "disk" and plan.matched == 28
    assert plan.declines == ["end snapshot: cache cannot be cut back: 31 -> 28"]
    again = meta(PROMPT[:24], (5, 8, 16, 24), trimmable=False, kind="boundary", sid="b2")
    assert plan_restore([(boundary, "disk"), (again, "memory")], PROMPT, "exact", CUTS).meta is again


def test_a_memory_snapshot_nearly_as_long_wins_over_the_disk_but_not_for_a_regenerate():
    """A document's state read ahead into memory (16 tokens) against a conversation's end on disk
    that matches a little further (24): a few tokens are cheaper to forward than the disk is to
    read. A disk snapshot that restores all but the last token (a regenerate) still wins."""
    doc = meta(PROMPT[:16], (5, 8, 16), kind="document", sid="doc")
    longer = meta(PROMPT[:24] + [77, 78], CUTS[:3] + (24,), sid="end")
    plan = plan_restore([(longer, "disk"), (doc, "memory")], PROMPT, "exact", CUTS)
    assert (plan.meta, plan.source, plan.reuse) == (doc, "memory", 16)
    whole = meta(PROMPT + [90], CUTS, sid="whole")
    plan = plan_restore([(whole, "disk"), (doc, "memory")], PROMPT, "exact", CUTS)
    assert (plan.meta, plan.source, plan.reuse) == (whole, "disk", 28)


def test_a_tie_goes_to_the_snapshot_whose_copy_is_at_hand():
    """Two memory snapshots restore the same 16 tokens: the smaller wins (less to copy), unless
    the other's restored copy is ready (PromptCache's spare: nothing to copy at all)."""
    doc = meta(PROMPT[:16], (5, 8, 16), kind="document", sid="doc")
    turn = meta(PROMPT[:16] + [77, 78, 79], (5, 8, 16), sid="turn")
    assert plan_restore([(turn, "memory"), (doc, "memory")], PROMPT, "exact", CUTS).meta is doc
    plan = plan_restore([(turn, "memory"), (doc, "memory")], PROMPT, "exact", CUTS, ready="turn")
    assert (plan.meta, plan.reuse) == (turn, 16)
    on_disk = plan_restore([(turn, "disk"), (doc, "memory")], PROMPT, "exact", CUTS, ready="turn")
    assert on_disk.meta is doc  # a copy at hand never makes the disk win over memory
    longer = meta(PROMPT[:24] + [1], CUTS[:3] + (24,), sid="longer")
    assert plan_restore([(turn, "memory"), (longer, "memory")], PROMPT, "exact", CUTS, ready="turn").meta is longer
