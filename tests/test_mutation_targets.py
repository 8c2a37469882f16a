"""The mutation check's list cannot rot: every mutation's target text is still in the engine
sources exactly once, and every test named as its catcher exists (tests/mutation_check.py)."""

from __future__ import annotations

from tests.mutation_check import MUTATIONS, target_problems


def test_every_mutation_target_and_catcher_exists():
    assert target_problems(MUTATIONS) == []
    assert all(m.tests for m in MUTATIONS)
