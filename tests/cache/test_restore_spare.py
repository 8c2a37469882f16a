"""Issue 27: a regenerate right after a reply takes over that reply's live cache (the spare: the
snapshot copied what it keeps, nothing else holds the cache), so no copy of the state stands
between the request and its first forward; the stored snapshot's bits never change, whatever the
generation writes into the cache it was handed."""

from __future__ import annotations

import numpy as np
import pytest
from mlx.utils import tree_flatten

from engine.cache.snapshot import cache_arrays
from tests.engine_helpers import cold_request, make_engine, request

LONG = "Explain how a prompt cache works in two sentences. " * 3


class FirstCache:
    """Stands in for the model: records the cache objects its first forward is given."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.first: list | None = None

    def __call__(self, x, cache=None):
        if self.first is None:
            self.first = list(cache or [])
        return self.inner(x, cache=cache)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _bits(arrays) -> list[np.ndarray]:
    return [np.array(a).copy() for a in arrays]


def _pack_arrays(pc) -> list:
    return [a for blk in pc.memory._blocks.values() for kv in blk.pack.layers if kv is not None
            for _, a in tree_flatten(kv)]


@pytest.mark.parametrize("family", ["llama", "kvquant"])
def test_regenerate_hands_over_the_spare_and_keeps_the_snapshot_bits(models, family):
    eng = make_engine(models[family])
    msgs = [{"role": "user", "content": LONG}]
    n = len(eng.prompt_ids(msgs))
    first = eng.generate(request(msgs, max_tokens=12))
    pc = eng.cache
    sid, spare = pc._spare  # the reply's end snapshot and the reply's own live cache
    held = _pack_arrays(pc)  # the memory tier's blocks (a later put may drop the snapshot itself)
    before = _bits(held)
    snap_ids = {id(a) for a in held}
    assert snap_ids.isdisjoint(id(a) for a in cache_arrays([d for d in spare if d is not None]))

    probe = FirstCache(eng.lm.model)
    eng.lm.model = probe
    try:
        again = eng.generate(request(msgs, max_tokens=12))
    finally:
        eng.lm.model = probe.inner
    assert again.report.restored == n - 1 and again.report.source == "memory"
    assert pc.spare_hits == 1
    # the first forward ran on the spare's own layer objects: nothing was copied for it
    assert probe.first is not None
    assert [id(c) for c in probe.first] == [id(d) for d in spare]
    # the generation wrote the regenerate's tokens into those buffers; the snapshot's are as stored
    assert all(np.array_equal(a, b) for a, b in zip(before, _bits(held)))
    assert again.tokens == first.tokens and again.logprobs == first.logprobs

    # a second regenerate (from the spare the regenerate left) restores the same bits, same reply
    third = eng.generate(request(msgs, max_tokens=12))
    assert pc.spare_hits == 2
    assert all(np.array_equal(a, b) for a, b in zip(before, _bits(held)))
    assert third.tokens == first.tokens and third.logprobs == first.logprobs


def test_spare_serves_a_cut_back_restore_and_never_another_snapshot(models):
    eng = make_engine(models["llama"])
    a = [{"role": "user", "content": LONG}]
    b = [{"role": "user", "content": LONG + " Briefly."}]
    ra = eng.generate(request(a, max_tokens=6))
    rb = eng.generate(request(b, max_tokens=6))  # restores a's snapshot cut back to the shared prefix
    assert 0 < rb.report.restored < len(eng.prompt_ids(a)) - 1 and eng.cache.spare_hits == 1
    cold = make_engine(models["llama"]).generate(cold_request(request(b, max_tokens=6)))
    assert rb.tokens == cold.tokens and rb.logprobs == cold.logprobs
    again = eng.generate(request(a, max_tokens=6))  # b's spare copies b's snapshot, not a's
    assert again.report.restored == len(eng.prompt_ids(a)) - 1 and eng.cache.spare_hits == 1
    assert again.tokens == ra.tokens and again.logprobs == ra.logprobs


def test_no_spare_where_the_memory_budget_has_no_room_for_it(models):
    """The spare is memory too: with a budget that holds the snapshots but not one more state,
    no spare is kept and the regenerate copies first, identically."""
    probe = make_engine(models["llama"])
    msgs = [{"role": "user", "content": LONG}]
    first = probe.generate(request(msgs, max_tokens=12))
    held = probe.cache.stats()["memory_bytes"]
    eng = make_engine(models["llama"], memory_budget=held + 1)
    assert eng.generate(request(msgs, max_tokens=12)).tokens == first.tokens
    assert eng.cache._spare is None  # no room left for it
    again = eng.generate(request(msgs, max_tokens=12))
    assert again.report.restored == len(eng.prompt_ids(msgs)) - 1 and eng.cache.spare_hits == 0
    assert again.tokens == first.tokens and again.logprobs == first.logprobs
