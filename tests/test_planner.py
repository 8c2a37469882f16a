"""The exactness planner on its own: pure functions over snapshot metadata, no MLX."""

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


def meta(tokens, cuts, trimmable=True, kind="end", sid="s", classes=("KVCache",)):
    return SnapshotMeta(sid, "k", tuple(tokens), kind, tuple(cuts), classes, trimmable, 100)


def test_schedule_cuts_at_multiples_of_c_message_starts_and_before_the_last_token():
    assert schedule_cuts(30, 8, [5, 12, 29, 40, 0]) == (5, 8, 12, 16, 24, 29)
    assert schedule_cuts(30, 512, [5, 12]) == (5, 12, 29)
    assert schedule_cuts(1, 8) == ()  # a one-token prompt: the token goes alone, nothing before it
    assert chunks(0, (5, 8, 12, 29)) == [(0, 5), (5, 8), (8, 12), (12, 29)]
    assert chunks(8, (5, 8, 12, 29)) == [(8, 12), (12, 29)]


def test_exact_only_where_both_schedules_made_the_same_cuts_before():
    m = meta(range(40), (8, 16, 20, 29))
    new = (8, 16, 20, 24, 35)  # another prompt sharing the first 20 tokens' cuts
    assert exact_at(m, 0, new)
    assert exact_at(m, 20, new) and exact_at(m, 16, new)
    assert not exact_at(m, 24, new)  # not a cut of the snapshot's history
    assert not exact_at(m, 29, new)  # not a cut of the new schedule
    assert not exact_at(m, 20, (8, 12, 16, 20, 35))  # the new prompt cut at 12, the snapshot did not
    assert not exact_at(m, 20, (16, 20, 35))  # the snapshot cut at 8, the new prompt did not


def test_reuse_point_exact_takes_the_longest_exact_cut_fast_takes_the_match():
    m = meta(range(40), (8, 16, 20, 29))
    assert reuse_point(m, 27, "exact", (8, 16, 20, 24, 35)) == 20
    assert reuse_point(m, 27, "fast", (8, 16, 20, 24, 35)) == 27
    assert reuse_point(m, 7, "exact", (8, 16)) == 0
    fast_made = meta(range(40), ())  # a fast-mode history: nothing exact
    assert reuse_point(fast_made, 30, "exact", (8, 16, 20, 29, 35)) == 0


def test_plan_declines_uncuttable_snapshots_and_prefers_memory():
    prompt = list(range(30)) + [99]  # 31 tokens; the last is forwarded alone
    cuts = schedule_cuts(31, 8, [20])
    ring = meta(range(40), (8, 16, 20, 24), trimmable=False, sid="ring", classes=("RotatingKVCache",))
    boundary = meta(range(20), (8, 16, 20), trimmable=False, kind="boundary", sid="b",
                    classes=("RotatingKVCache",))
    plan = plan_restore([(ring, "memory"), (boundary, "disk")], prompt, "exact", cuts)
    assert plan.meta is boundary and plan.reuse == 20 and plan.source == "disk"
    assert plan.matched == 30
    assert plan.declines == ["end snapshot: sliding window wrapped: cannot cut 40 -> 24"]
    same = meta(range(20), (8, 16, 20), trimmable=False, kind="boundary", sid="b2")
    plan = plan_restore([(boundary, "disk"), (same, "memory")], prompt, "exact", cuts)
    assert plan.meta is same  # equal reuse: memory before disk


def test_dominates_needs_the_other_history_as_a_prefix():
    a = meta(range(40), (8, 16, 20, 29))
    assert dominates(a, meta(range(30), (8, 16, 20)))  # a trimmable extension with the same exact history
    assert not dominates(a, meta(range(30), (8, 12, 16)))  # the other was exact at 12: a was not
    assert not dominates(meta(range(40), (8,)), meta(range(30), (8, 16)))  # less exact
    assert not dominates(meta(range(40), (8, 16), trimmable=False), meta(range(30), (8, 16)))  # cannot cut
    assert dominates(meta(range(30), (8, 16), trimmable=False), meta(range(30), (8, 16)))  # the same state
    assert not dominates(meta(range(40), (8, 16)), meta([1, 2, 3], ()))  # other tokens
