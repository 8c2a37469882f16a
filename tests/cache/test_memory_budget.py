"""Memory visible and bounded (issue 50, item 7): the memory tier's budget is sized to the machine
and settable at run time (a smaller one evicts at once), MLX's buffer cache is limited, the engine
reports where its memory is, and once the tier is full the engine's memory stops growing.

No wall clock: the mechanism is asserted (the tier's bytes against its budget, MLX's own counters),
turn by turn."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from engine import memory
from engine.engine import Engine
from engine.errors import EngineError
from engine.memory import GIB, MIB, default_memory_budget, limit_mlx_cache
from engine.types import GenerationRequest, SamplerSettings
from tests.engine_helpers import make_engine, request

WORDS = "the quick brown fox jumps over lazy dog sky blue why because light scattering".split()


def question(i: int) -> GenerationRequest:
    """A new conversation of the same length every time (nothing restores another's state)."""
    text = " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(150))
    return GenerationRequest([{"role": "user", "content": f"Question {i}: {text}"}],
                             SamplerSettings(max_tokens=24, temperature=0.9, seed=i))


@pytest.fixture
def cache_limit() -> Iterator[None]:
    """The test sets MLX's (process-wide) buffer cache limit; the engine's default after it."""
    try:
        yield
    finally:
        limit_mlx_cache(memory.MLX_CACHE_LIMIT)


def test_the_default_budget_is_a_sixteenth_of_the_machine_within_bounds() -> None:
    assert default_memory_budget(16 * GIB) == 1 * GIB
    assert default_memory_budget(8 * GIB) == 512 * MIB
    assert default_memory_budget(2 * GIB) == 256 * MIB  # at least
    assert default_memory_budget(512 * GIB) == 4 * GIB  # at most
    assert default_memory_budget(0) == 2 * GIB  # unknown
    assert Engine(use_disk=False).cache.budget_bytes == default_memory_budget()


def test_a_smaller_budget_evicts_at_once_and_a_larger_one_keeps_more(tiny_model: Path) -> None:
    eng = make_engine(tiny_model, chunk=16)
    for i in range(4):
        eng.generate(question(i))
    full = eng.memory_report()
    assert full.tier_entries >= 4 and full.live_kv > 0  # the last reply's live cache, kept for a regenerate
    one = max(m.nbytes for m in eng.cache.metas())
    eng.set_memory_budget(one + one // 2)
    now = eng.memory_report()
    assert now.tier <= now.tier_budget == one + one // 2 and now.tier_entries == 1
    assert now.live_kv == 0  # no room left for the spare: dropped too
    # The one kept is the one used last: the last question regenerates from memory.
    again = eng.generate(question(3))
    assert again.report.source == "memory" and again.report.restored == again.report.prompt_tokens - 1
    eng.set_memory_budget(64 * MIB)
    for i in range(4, 7):
        eng.generate(question(i))
    assert eng.memory_report().tier_entries >= 4
    with pytest.raises(EngineError, match="bytes"):
        eng.set_memory_budget(-1)


def test_the_memory_report_names_each_part(tiny_model: Path) -> None:
    eng = make_engine(tiny_model, chunk=16)
    assert eng.memory_report().mlx_cache == 0  # the load's temporaries are not kept for reuse
    eng.generate(request([{"role": "user", "content": "Why is the sky blue?"}]))
    m = eng.memory_report()
    assert m.weights == sum(p.nbytes for _, p in tree_flatten(eng.lm.model.parameters())) > 0
    assert m.tier == eng.cache_stats()["memory_bytes"] > 0 and m.tier_budget == eng.cache.budget_bytes
    assert m.live_kv == eng.cache.spare_bytes() > 0
    assert m.mlx_active >= m.weights + m.tier + m.live_kv and m.other_mlx == m.mlx_active - m.weights - m.tier - m.live_kv
    assert m.mlx_cache_limit == memory.MLX_CACHE_LIMIT and m.rss > m.mlx_active
    assert set(m.to_dict()) >= {"weights", "live_kv", "tier", "tier_budget", "mlx_active", "mlx_cache", "rss",
                                "other_mlx"}
    assert len(m.lines()) == 6


def test_once_the_tier_is_full_the_engines_memory_stops_growing(tiny_model: Path, cache_limit: None) -> None:
    """Twelve new conversations of one size under a budget that holds two: from the turn the tier
    is full on, its bytes stay within the budget, MLX's active memory stays where it was (each
    turn's new state replaces an evicted one) and its buffer cache within its limit."""
    budget, limit = 3 * MIB, 2 * MIB
    eng = Engine(use_disk=False, chunk=16, memory_budget=budget, mlx_cache_limit=limit)
    eng.load(str(tiny_model))
    seen = []
    for i in range(12):
        eng.generate(question(i))
        m = eng.memory_report()
        assert m.tier <= budget and m.mlx_cache <= limit, (i, m)
        seen.append(m)
    one = max(m.nbytes for m in eng.cache.metas())
    full = next(i for i, m in enumerate(seen) if m.tier + one > budget)  # no room for another conversation
    assert full <= 3 and all(m.tier_entries == seen[full].tier_entries for m in seen[full:])
    # Flat, not growing by a conversation's state per turn (`one`): within a few token arrays.
    assert max(m.mlx_active for m in seen[full:]) - seen[full].mlx_active < one // 20, [m.mlx_active for m in seen]
    assert max(m.mlx_peak for m in seen[full + 1:]) - seen[full + 1].mlx_peak < one // 20
