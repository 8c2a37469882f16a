"""Issue 27: the memory tier holds each block once. Variants and turns of one conversation share
their prefix in memory; a put copies only the positions the tier lacks; a block shared by two
snapshots outlives the one dropped; a restore is a private buffer (what the generation writes
into it never reaches the blocks); replies stay bit-identical to cold runs throughout."""

from __future__ import annotations

import numpy as np
import pytest
from mlx.utils import tree_flatten

from tests.engine_helpers import cold_request, make_engine, request

LONG = "Explain how a prompt cache works, block by block, in a few sentences. " * 4


def _position_bytes(eng) -> int:
    """Bytes one position of the whole state takes (every layer of the tiny llama is plain KV)."""
    meta = max(eng.cache.metas(), key=lambda m: m.length)
    return meta.nbytes // meta.length


def _packs(eng) -> dict[int, object]:
    return {id(b.pack): b.pack for b in eng.cache.memory._blocks.values()}


def _pack_bits(packs) -> list[np.ndarray]:
    return [np.array(a).copy() for p in packs for kv in p.layers if kv is not None for _, a in tree_flatten(kv)]


def test_four_variants_hold_their_shared_prefix_once(models):
    eng = make_engine(models["llama"])
    msgs = [{"role": "user", "content": LONG}]
    n = len(eng.prompt_ids(msgs))
    replies = [eng.generate(request(msgs, temperature=1.0, seed=s, max_tokens=12)) for s in (1, 2, 3, 4)]
    assert [r.report.restored for r in replies[1:]] == [n - 1] * 3  # each restored the pre-last point
    per_pos = _position_bytes(eng)
    metas = eng.cache.metas()
    own = [m.length - (n - 1) for m in metas]  # the last prompt token and the reply's forwarded tokens
    assert len(metas) == 4 and all(m.tokens[: n - 1] == metas[0].tokens[: n - 1] for m in metas)
    stats = eng.cache.stats()
    # the prompt once, and each variant's own positions
    assert stats["memory_bytes"] == ((n - 1) + sum(own)) * per_pos
    assert stats["memory_bytes"] <= 1.3 * metas[0].nbytes
    assert stats["memory_shared_bytes"] == 3 * (n - 1) * per_pos
    # the debug panel's store box says it
    from app.core.conversation.view_models import format_bytes, stats_rows

    row = stats_rows(stats)["memory"][0]
    assert f", {stats['memory_blocks']} blocks, {format_bytes(3 * (n - 1) * per_pos)} shared" in row
    for s, r in zip((1, 2, 3, 4), replies):
        cold = make_engine(models["llama"]).generate(cold_request(request(msgs, temperature=1.0, seed=s, max_tokens=12)))
        assert r.tokens == cold.tokens and r.logprobs == cold.logprobs


def test_each_turn_copies_only_what_it_adds(models):
    eng = make_engine(models["llama"])
    msgs: list[dict[str, str]] = []
    total = 0
    for turn in range(3):
        msgs.append({"role": "user", "content": f"Turn {turn}: " + LONG[: 60 + 20 * turn]})
        before = set(_packs(eng))
        r = eng.generate(request(msgs, max_tokens=8))
        msgs.append({"role": "assistant", "content": r.text})
        new = [p for k, p in _packs(eng).items() if k not in before]
        per_pos = _position_bytes(eng)
        restored = r.report.restored
        assert restored > 0 or turn == 0
        # the new packs start where the restore left off and cover only the positions after it
        assert min(p.start for p in new) == restored
        end = max(eng.cache.metas(), key=lambda m: m.length)
        assert end.kind == "end" and max(p.end for p in new) == end.length
        assert sum(p.end - p.start for p in new) == end.length - restored
        assert sum(p.nbytes for p in new) == (end.length - restored) * per_pos
        total = end.length
        cold = make_engine(models["llama"]).generate(cold_request(request(msgs[:-1], max_tokens=8)))
        assert r.tokens == cold.tokens and r.logprobs == cold.logprobs
    assert total > 0


def test_a_block_shared_by_two_snapshots_outlives_the_one_dropped(models):
    eng = make_engine(models["llama"])
    a = [{"role": "user", "content": LONG}]
    b = [{"role": "user", "content": LONG + " Briefly, please."}]
    ra = eng.generate(request(a, max_tokens=6))
    rb = eng.generate(request(b, max_tokens=6))  # restores a's state cut back to the shared prefix
    shared = rb.report.restored
    assert shared > 0
    metas = {m.tokens[: len(eng.prompt_ids(a)) - 1] == tuple(eng.prompt_ids(a)[:-1]): m for m in eng.cache.metas()}
    snap_a, snap_b = metas[True], metas[False]
    mem = eng.cache.memory
    shared_keys = set(mem._items[snap_a.id].block_names) & set(mem._items[snap_b.id].block_names)
    assert shared_keys and all(mem._blocks[k].end <= shared for k in shared_keys)
    mem.drop(snap_a.id)
    assert set(mem._blocks) == set(mem._items[snap_b.id].block_names)  # a's own blocks went, the shared ones stayed
    assert mem.stats()["bytes"] == sum(p.nbytes for p in _packs(eng).values())
    again = eng.generate(request(b, max_tokens=6))
    assert again.report.restored == len(eng.prompt_ids(b)) - 1 and again.report.source == "memory"
    assert again.tokens == rb.tokens and again.logprobs == rb.logprobs
    cold = make_engine(models["llama"]).generate(cold_request(request(a, max_tokens=6)))
    assert ra.tokens == cold.tokens and ra.logprobs == cold.logprobs


@pytest.mark.parametrize("family", ["llama", "gemma3"])  # gemma3: windows kept whole, KV layers in blocks
def test_restores_never_write_into_the_blocks(models, family):
    """Every restore, cut back or not, sampled or greedy, fast or exact, is a private buffer."""
    eng = make_engine(models[family])
    msgs = [{"role": "user", "content": LONG}]
    first = eng.generate(request(msgs, max_tokens=8))
    packs = list(_packs(eng).values())
    assert packs, "the KV layers are kept in blocks"
    before = _pack_bits(packs)
    eng.cache.spares = False  # every restore assembles from the blocks
    assert eng.generate(request(msgs, temperature=1.0, seed=3, max_tokens=8)).report.restored > 0
    other = [{"role": "user", "content": LONG + " And why?"}]
    cut_back = [eng.generate(request(other, mode=mode, max_tokens=8)).report.restored for mode in ("fast", "exact")]
    assert family == "gemma3" or min(cut_back) > 0  # a wrapped window cannot be cut back: no restore
    after = _pack_bits(packs)
    assert all(np.array_equal(x, y) for x, y in zip(before, after))
    again = eng.generate(request(msgs, max_tokens=8))
    assert again.tokens == first.tokens and again.logprobs == first.logprobs


def test_memory_budget_counts_unique_bytes_and_evicts_whole_chains(models):
    """With room for about two variants' own blocks beside the prompt, older variants go first and
    the prompt they share stays until the last of them goes."""
    probe = make_engine(models["llama"])
    msgs = [{"role": "user", "content": LONG}]
    n = len(probe.prompt_ids(msgs))
    probe.generate(request(msgs, max_tokens=12))
    per_pos = _position_bytes(probe)
    own = probe.cache.metas()[0].length - (n - 1)
    budget = (n - 1) * per_pos + 2 * own * per_pos + per_pos // 2
    eng = make_engine(models["llama"], memory_budget=budget)
    eng.cache.spares = False
    for s in (1, 2, 3):
        eng.generate(request(msgs, temperature=1.0, seed=s, max_tokens=12))
    stats = eng.cache.stats()
    assert stats["memory_entries"] == 2 and stats["memory_bytes"] <= budget
    assert stats["memory_bytes"] == sum(m.length for m in eng.cache.metas()) * per_pos - (n - 1) * per_pos
    r = eng.generate(request(msgs, temperature=1.0, seed=3, max_tokens=12))
    assert r.report.restored == n - 1 and r.report.source == "memory"
