"""The prompt cache guarantees (G1, G3, G4, G5) on every cache family, compared exactly."""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from engine.cache.prompt_cache import PromptCache
from engine.cache.planner import schedule_cuts
from engine.cache.families import layer_offset
from engine.generate.sampling import Sampler
from engine.types import CancelToken, PrefillProgress, SamplerSettings, TokenEvent
from tests.engine_helpers import (
    ALL_FAMILIES,
    QUESTIONS,
    chat_turns,
    cold_request,
    forwards,
    kv_snapshot,
    make_engine,
    request,
    require_openblas,
)

LONG_Q = "Explain how a prompt cache works in two sentences. " * 3


def kv_offsets(report):
    return [o for o in report.layer_offsets if o is not None]


def schedule(chunk, start, n, message_starts=(), reply_header_cuts=()):
    """The forwards a run makes from `start` (a restore point, or 0): the prompt cut at every
    multiple of `chunk`, every message start and every reply header cut, then the last prompt
    token alone. Written out here from the rule, not taken from the engine."""
    cuts = sorted({c for c in range(chunk, n - 1, chunk)} | {m for m in message_starts if 0 < m < n - 1}
                  | {h for h in reply_header_cuts if 0 < h < n - 1} | {n - 1})
    out, pos = [], start
    for c in cuts:
        if c > pos:
            out.append((pos, c))
            pos = c
    return out + [(n - 1, n)]


@pytest.mark.parametrize("mode", ["exact", "fast"])
@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_whole_prompt_hit_restores_len_minus_one_and_is_identical(models, family, mode):
    """G4 + G1 + G3: the regenerate's first forward is the last prompt token alone on a cache
    holding exactly prompt[:-1] (seen at the model), and its reply equals a separate cold run."""
    eng = make_engine(models[family])
    msgs = [{"role": "user", "content": LONG_Q}]
    n = len(eng.prompt_ids(msgs))
    eng.generate(request(msgs, mode=mode, max_tokens=24))  # cold: stores the snapshots
    with forwards(eng) as log:
        again = eng.generate(request(msgs, mode=mode, max_tokens=24))
    assert again.report.restored == n - 1 and again.report.source == "memory"
    width, offsets = log.calls[0]
    assert width == 1 and offsets and all(o == n - 1 for o in offsets if o is not None), log.calls[0]
    assert any(o is not None for o in offsets)
    assert all(w == 1 for w, _ in log.calls)  # no prefill at all (G4)
    assert kv_offsets(again.report) == [o for o in offsets if o is not None]
    cold = make_engine(models[family]).generate(cold_request(request(msgs, mode=mode, max_tokens=24)))
    assert again.tokens == cold.tokens
    assert again.logprobs == cold.logprobs  # bit-equal, not approximately


def test_whole_prompt_bug_reproduced_on_purpose(models):
    """Restoring the whole prompt and forwarding its last token again: the classic bug.

    Computed by hand here, both ways; the engine's own replies (cold and regenerated) must be
    the correct one, so the guard above cannot silently become meaningless.
    """
    eng = make_engine(models["llama"])
    lm = eng.lm
    msgs = [{"role": "user", "content": LONG_Q}]
    prompt = eng.prompt_ids(msgs)
    n = len(prompt)
    steps = 12

    def decode(cache):
        """Forward the last prompt token, then decode greedily; offsets after that forward too."""
        sampler = Sampler(SamplerSettings())
        y, toks, lps, offsets = mx.array([prompt[-1]]), [], [], None
        for _ in range(steps):
            tok, lp = sampler(lm.model(y.reshape(1, 1), cache=cache)[:, -1, :])
            offsets = offsets or [c.offset for c in cache]
            toks.append(tok.item())
            lps.append(lp.item())
            y = tok
        return toks, lps, offsets

    first = eng.generate(request(msgs, max_tokens=steps))  # cold
    starts = first.report.message_starts

    def prefilled(upto):
        cuts = sorted(set(range(eng.chunk, upto, eng.chunk)) | {m for m in starts if 0 < m < upto} | {upto})
        cache = lm.new_cache()
        for s, e in zip([0, *cuts], cuts):  # the engine's schedule, written out
            lm.model(mx.array([prompt[s:e]]), cache=cache)
            mx.eval([c.state for c in cache])
        return cache

    right, right_lps, offsets = decode(prefilled(n - 1))  # the right way: cache holds prompt[:-1]
    assert offsets == [n] * len(offsets)
    _, buggy_lps, offsets = decode(prefilled(n))  # a cache holding the whole prompt, last token again
    assert offsets == [n + 1] * len(offsets)  # the last prompt token now sits in the cache twice
    assert max(abs(a - b) for a, b in zip(buggy_lps, right_lps)) > 1e-4
    # The engine takes the right path, cold and on a regenerate (whole-prompt hit).
    again = eng.generate(request(msgs, max_tokens=steps))
    assert again.report.restored == n - 1
    for r in (first, again):
        k = len(r.tokens)
        assert k > 0 and (r.tokens, r.logprobs) == (right[:k], right_lps[:k])
        assert r.logprobs != buggy_lps[:k]


def _conversation(eng, mode, turns=3, q=QUESTIONS[0], logs=None):
    """`turns` turns of one conversation: [(request, result)]; with `logs` (a list), each turn's
    forwards are recorded (a ForwardLog per turn)."""
    return chat_turns(eng, [{"role": "user", "content": q}], lambda t: f"And then? ({t})", turns, mode, logs=logs)


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_exact_mode_multi_turn_equals_cold_with_cache_used(models, family):
    require_openblas()
    eng = make_engine(models[family])
    logs = []
    results = _conversation(eng, "exact", logs=logs)
    cold_eng = make_engine(models[family])
    for (_, prev), (req, r) in zip(results, results[1:]):
        # restored at the previous turn's regenerate point: its prompt but the last token (the
        # end of its generation header, a reply header cut of this prompt)
        assert r.report.restored == len(prev.prompt_ids) - 1 == r.report.reply_header_cuts[-1]
        cold = cold_eng.generate(cold_request(req))
        assert r.tokens == cold.tokens
        assert r.logprobs == cold.logprobs
    # At the model: each turn's prefill (the forwards before its first decode step) is exactly
    # the aligned schedule from its restore point.
    for log, (_, r) in zip(logs, results):
        n, start = len(r.prompt_ids), r.report.restored
        expected = schedule(eng.chunk, start, n, r.report.message_starts, r.report.reply_header_cuts)
        assert log.calls[0][1] and all(o in (None, start) for o in log.calls[0][1])  # restored state
        assert log.spans[: len(expected)] == expected


# Not gemma3: its sliding window has wrapped, so fast mode too can restore only a whole snapshot,
# and the one a follow-up finds (turn 1's pre-last) is at a reply header cut: an exact point. Its
# control is tests/cache/test_reply_header_cuts.py::test_control_without_reply_header_cuts_the_cold_run_differs.
@pytest.mark.parametrize("family", [f for f in ALL_FAMILIES if f != "gemma3"])
def test_control_fast_mode_reuse_differs_from_cold(models, family):
    """Same conditions, fast mode (decoded tokens, unaligned boundary): must differ in most
    conversations, else the exact-mode test above could not fail."""
    require_openblas()
    differ = exact_differ = 0
    for q in QUESTIONS:
        for mode in ("fast", "exact"):
            eng = make_engine(models[family], chunk=8)
            (_, _), (req, warm) = _conversation(eng, mode, turns=2, q=q)
            assert warm.report.restored > 0
            cmp = eng.verify(req, warm)
            if mode == "fast":
                differ += not cmp.identical
            else:
                exact_differ += not cmp.identical
    assert exact_differ == 0
    assert differ >= len(QUESTIONS) // 2 + 1, f"fast-mode reuse differed in only {differ}/{len(QUESTIONS)}"


@pytest.mark.parametrize("family,reason", [("gemma3", "sliding window wrapped"), ("lfm2", "SSM/conv state")])
def test_uncuttable_cache_declined_never_partially_restored(models, family, reason):
    # The question is edited: the prompts part inside the user message, where no stored state is
    # exact (chunk 512: no aligned cut; the message cuts lie after it). The snapshots could only
    # be used by cutting them back, which a wrapped ring or SSM state cannot do.
    eng = make_engine(models[family], chunk=512)
    eng.generate(request([{"role": "user", "content": LONG_Q}], max_tokens=12))
    req = request([{"role": "user", "content": LONG_Q + " Please answer in detail."}], max_tokens=12)
    with forwards(eng) as log:
        second = eng.generate(req)
    rep = second.report
    assert rep.matched > 0
    assert any(reason in d and "cannot cut" in d for d in rep.declines), rep.declines
    assert rep.restored == 0 and rep.stored is None and rep.source is None
    # Nothing partial was installed: seen at the model, the first forward starts from an empty
    # cache and the prefill covers the whole prompt.
    n = len(second.prompt_ids)
    assert all(o in (None, 0) for o in log.calls[0][1]), log.calls[0]
    expected = schedule(512, 0, n, rep.message_starts)
    assert log.spans[: len(expected)] == expected


@pytest.mark.parametrize("family", ["gemma3", "lfm2"])
def test_uncuttable_cache_uses_boundary_checkpoint(models, family):
    """A second turn that shares turn 1 only up to the start of its generation prompt (another
    user message where the reply would be) restores the "boundary" checkpoint. C = 512: the
    checkpoint is then at that start (with C = 8 a multiple of 8 inside the header comes after
    it, which only a follow-up reaches, and a follow-up restores the pre-last: the test below)."""
    chunk = 512
    eng = make_engine(models[family], chunk=chunk)
    logs = []
    ask = [{"role": "user", "content": LONG_Q}]
    with forwards(eng) as log:
        first = eng.generate(request(ask, max_tokens=12))
    logs.append(log)
    req = request(ask + [{"role": "user", "content": "And then?"}], max_tokens=12)
    with forwards(eng) as log:
        second = eng.generate(req)
    logs.append(log)
    rep = second.report
    n1 = first.report.prompt_tokens
    # the checkpoint sits at the last cut before n - 1: the start of turn 1's generation prompt
    boundary = max(c for c in schedule_cuts(n1, chunk, first.report.message_starts) if c < n1 - 1)
    assert boundary == first.report.message_starts[-1]
    assert second.prompt_ids[:boundary] == first.prompt_ids[:boundary]
    assert second.prompt_ids[: n1 - 1] != first.prompt_ids[: n1 - 1]
    assert rep.restored == boundary and rep.stored == boundary and not rep.partial
    assert logs[1].spans[0][0] == boundary  # turn 2's first forward found the checkpoint's state
    assert any(s["kind"] == "boundary" and s["length"] == boundary for s in first.report.snapshots_stored)
    assert any("cannot cut" in d for d in rep.declines)  # the longer snapshots could not be cut
    cold = make_engine(models[family], chunk=chunk).generate(cold_request(req))
    assert second.tokens == cold.tokens and second.logprobs == cold.logprobs


@pytest.mark.parametrize("family", ["gemma3", "lfm2"])
@pytest.mark.parametrize("chunk", [8, 512])
def test_uncuttable_cache_next_turn_restores_the_regenerate_point(models, family, chunk):
    """The next turn of a chat cuts at the end of turn 1's generation header but its last token
    (a reply header cut): the pre-last snapshot of turn 1 is then an exact restore for it,
    whole, with no cut back (what a cache that cannot be cut back needs)."""
    eng = make_engine(models[family], chunk=chunk)
    logs = []
    (_, first), (req, second) = _conversation(eng, "exact", turns=2, q=LONG_Q, logs=logs)
    rep = second.report
    n1 = first.report.prompt_tokens
    assert rep.reply_header_cuts == [n1 - 1]
    assert any(s["kind"] == "pre-last" and s["length"] == n1 - 1 for s in first.report.snapshots_stored)
    assert rep.restored == rep.stored == n1 - 1 and not rep.partial
    assert logs[1].spans[0][0] == n1 - 1  # turn 2's first forward found turn 1's prompt[:-1]
    cold = make_engine(models[family], chunk=chunk).generate(cold_request(req))
    assert second.tokens == cold.tokens and second.logprobs == cold.logprobs


def test_fast_mode_reuses_decoded_tokens(models):
    eng = make_engine(models["llama"])
    (_, first), (req, second) = _conversation(eng, "fast", turns=2)
    assert second.report.restored > first.report.prompt_tokens  # part of the reply was reused
    # the end snapshot: prompt + reply minus its last token (never forwarded: max_tokens reached)
    assert second.report.stored == first.report.prompt_tokens + len(first.tokens) - 1
    assert second.report.restored <= second.report.stored


@pytest.mark.parametrize("family", ["llama", "lfm2"])
def test_prefill_after_an_unaligned_restore_is_cut_at_absolute_multiples(models, family):
    """Fast mode restores mid-reply (an unaligned point): its prefill forwards, counted at the
    model, still end on multiples of C, so every later aligned boundary matches a cold run's."""
    eng = make_engine(models[family], chunk=8)
    logs = []
    (_, first), (_, second) = _conversation(eng, "fast", turns=2, logs=logs)
    start, n = second.report.restored, len(second.prompt_ids)
    assert start > len(first.prompt_ids) - 1 and start % 8, "the test needs an unaligned restore"
    expected = schedule(8, start, n, second.report.message_starts, second.report.reply_header_cuts)
    assert logs[1].spans[: len(expected)] == expected
    expected = schedule(8, 0, len(first.prompt_ids), first.report.message_starts, first.report.reply_header_cuts)
    assert logs[0].spans[: len(expected)] == expected


@pytest.mark.parametrize("family", ["llama", "kvquant"])  # caches that can be cut back into a reply
def test_exact_regenerate_after_fast_mode_equals_cold(models, family):
    """Exact mode after a fast-mode generation of the same turn: the fast run restored mid-reply
    (decoded tokens, an unaligned point), so nothing it computed or stored is exact past turn 1's
    prompt; exact mode may restore it only up to there (a bound taken from turn 1's length)."""
    require_openblas()
    eng = make_engine(models[family], chunk=8)
    (_, first), (fast_req, fast) = _conversation(eng, "fast", turns=2)
    assert fast.report.restored > len(first.prompt_ids) - 1  # the fast run reused decoded tokens
    bound = len(first.prompt_ids) - 1  # turn 1's prefill: the end of every exact history so far
    fast_snaps = [m for m in eng.cache.metas() if m.tokens[: len(fast.prompt_ids) - 1] == tuple(fast.prompt_ids[:-1])]
    assert fast_snaps and all(m.canonical <= bound for m in fast_snaps)
    exact_req = request(fast_req.messages, mode="exact", max_tokens=12)
    with forwards(eng) as log:
        exact = eng.generate(exact_req)
    start = log.spans[0][0]
    assert 0 < start <= bound, (start, bound)
    assert exact.report.restored == start
    cold = make_engine(models[family], chunk=8).generate(cold_request(exact_req))
    assert (exact.tokens, exact.logprobs) == (cold.tokens, cold.logprobs)


def test_cancel_mid_prefill_leaves_no_lying_snapshot(models):
    eng = make_engine(models["llama"], chunk=8)
    msgs = [{"role": "user", "content": LONG_Q * 2}]
    cancel = CancelToken()
    seen = []

    def on_event(e):
        if isinstance(e, PrefillProgress):
            seen.append(e.done)
            if e.done >= 24:
                cancel.cancel()

    r = eng.generate(request(msgs), on_event, cancel)
    assert r.finish_reason == "cancelled" and r.tokens == []
    assert seen[-1] < r.report.prompt_tokens - 1  # stopped inside prefill
    for meta in eng.cache.metas():
        held = eng.cache.memory.cache_of(meta.id)
        assert all(layer_offset(c) in (None, meta.length) for c in held)
        assert meta.length <= seen[-1]
    # Resuming reuses the checkpoint and still matches a cold run exactly.
    again = eng.generate(request(msgs))
    assert again.report.restored > 0
    assert eng.verify(request(msgs), again).identical


def test_restore_never_aliases_the_stored_snapshot(models):
    eng = make_engine(models["llama"])
    msgs = [{"role": "user", "content": LONG_Q}]
    eng.generate(request(msgs))
    # Hold the memory tier's packs themselves: a later put may drop the snapshots from the cache.
    held = [blk.pack for blk in eng.cache.memory._blocks.values()]
    before = [[kv[0].tolist() for kv in p.layers if kv is not None] for p in held]
    # Restores cut back to the pre-last position and to the shared prefix, then write other
    # tokens there (sampled, another seed; another question, fast and exact mode).
    assert eng.generate(request(msgs, temperature=1.0, seed=5)).report.restored > 0
    other = [{"role": "user", "content": LONG_Q + " And why?"}]
    assert eng.generate(request(other, mode="fast")).report.restored > 0
    eng.generate(request(other))
    assert [[kv[0].tolist() for kv in p.layers if kv is not None] for p in held] == before


def test_memory_budget_evicts_least_recently_used():
    """Room for three snapshots: touching the oldest (a restore) makes the second-oldest go first."""
    snaps = {name: kv_snapshot([i + 1] * 40, seed=i) for i, name in enumerate("ABCD")}
    size = snaps["A"].meta.nbytes
    cache = PromptCache(budget_bytes=int(3.5 * size))
    for name in "ABC":
        cache.put(snaps[name])
    plan, restored = cache.fetch("k" * 32, [1] * 40 + [7], "fast", 8)  # restores A
    assert plan.meta.id == snaps["A"].meta.id and restored is not None
    cache.put(snaps["D"])
    kept = {m.id for m in cache.metas()}
    assert kept == {snaps[n].meta.id for n in "ACD"}, "B, the least recently used, goes first"
    assert cache.stats()["memory_bytes"] == 3 * size <= cache.budget_bytes
    cache.put(snaps["B"])  # now C is the least recently used
    assert {m.id for m in cache.metas()} == {snaps[n].meta.id for n in "ADB"}


def test_report_describes_layers_and_aligned_chunks(models):
    eng = make_engine(models["gemma3"], chunk=8)
    with forwards(eng) as log:
        r = eng.generate(request([{"role": "user", "content": LONG_Q}]))
    rep = r.report
    assert [l.cache_class for l in rep.layers] == ["RotatingKVCache", "KVCache", "RotatingKVCache", "KVCache"]
    n = len(r.prompt_ids)
    assert rep.prompt_tokens == n and rep.prefill_tokens == n and rep.restored == 0
    # the chunks are cut at every multiple of 8 and every message start, nowhere else, and they
    # are what the model did: the forwards seen at the model
    assert rep.message_starts and all(0 < m < n - 1 for m in rep.message_starts)
    expected = schedule(8, 0, n, rep.message_starts)
    assert [tuple(c) for c in rep.chunks] == log.spans[: len(rep.chunks)] == expected
    assert rep.ttft_s > 0 and rep.decode_tps > 0


def test_disk_problem_reaches_the_report_once(models, tmp_path):
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    (cache_dir / "snapshots").write_text("not a folder")  # the tier cannot write anything here
    eng = make_engine(models["llama"], use_disk=True, cache_dir=cache_dir)
    msgs = [{"role": "user", "content": QUESTIONS[0]}]
    first = eng.generate(request(msgs))
    second = eng.generate(request(msgs))
    eng.close()
    assert len(first.report.warnings) == 1 and "cache" in first.report.warnings[0].lower()
    assert second.report.warnings == []
    assert second.report.restored == second.report.prompt_tokens - 1  # memory tier still works
    assert first.tokens == second.tokens


@pytest.mark.parametrize("mode", ["exact", "fast"])
@pytest.mark.parametrize("family", ["llama", "lfm2"])
def test_regenerate_identical_when_sampling(models, family, mode):
    """G1 at temperature > 0, in both modes: the seed's draws meet the same logits again."""
    eng = make_engine(models[family])
    _, (req, _) = _conversation(eng, mode, turns=2)  # a second turn, to regenerate it
    opts = dict(max_tokens=24, temperature=0.9, top_p=0.95, top_k=40, min_p=0.02, repetition_penalty=1.1, seed=11)
    a = eng.generate(request(req.messages, mode=mode, **opts))
    b = eng.generate(request(req.messages, mode=mode, **opts))
    assert b.report.restored == b.report.prompt_tokens - 1
    assert (a.tokens, a.logprobs) == (b.tokens, b.logprobs) and b.report.identical is True
    other = eng.generate(request(req.messages, mode=mode, **{**opts, "seed": 12}))
    assert other.tokens != a.tokens


@pytest.mark.linux_only  # the CPU backend; on Metal 4-bit weights stay packed (tests/project/test_platform.py)
def test_quantized_weights_expanded_on_cpu_when_they_fit(tmp_path):
    from engine import engine as engine_mod
    from tests.tiny_models import build_model

    folder = build_model(tmp_path / "q4", "llama", quantize_bits=4)
    auto, kept = make_engine(folder), make_engine(folder, dequantize=False)
    assert auto.info.dequantized is True and kept.info.dequantized is False  # CPU backend, tiny model
    assert auto.info.key != kept.info.key  # different arithmetic: never share snapshots
    msgs = [{"role": "user", "content": QUESTIONS[0]}]
    a = auto.generate(request(msgs))
    forced = make_engine(folder, dequantize=True).generate(request(msgs))
    assert (a.tokens, a.logprobs) == (forced.tokens, forced.logprobs)
    assert kept.generate(request(msgs)).tokens  # the 4-bit path still works
    # The size rule: expanded weights must fit a quarter of the RAM.
    f32 = engine_mod._expanded_f32_bytes(kept.lm.model)
    plain = make_engine(build_model(tmp_path / "f32", "llama")).lm.model
    assert f32 == sum(p.nbytes for _, p in tree_flatten(plain.parameters()))  # same shapes, as f32
    assert engine_mod._should_dequantize(None, f32) is True
    assert engine_mod._should_dequantize(None, 10 ** 15) is False
    assert engine_mod._should_dequantize(False, f32) is False


def test_first_token_is_handed_out_before_the_next_forward_is_queued(models):
    """TTFT is one forward on a regenerate: the first token event comes before the second decode
    forward is queued (on the CPU backend queueing it blocked the thread for most of a step);
    later tokens are pipelined, never more than one forward ahead."""
    eng = make_engine(models["llama"])
    model = eng.lm.model
    calls: list[int] = []  # width of every forward, in order

    class Counting:
        def __init__(self, inner):
            self.inner = inner

        def __call__(self, x, cache=None):
            calls.append(x.shape[1])
            return self.inner(x, cache=cache)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    req = request([{"role": "user", "content": "Why is the sky blue?"}], max_tokens=6)
    eng.generate(req)  # cold: stores the snapshots
    eng.lm.model = Counting(model)
    seen: list[tuple[int, int]] = []  # (token index, forwards issued so far)

    def on_event(e):
        if isinstance(e, TokenEvent):
            seen.append((e.index, len(calls)))

    try:
        r = eng.generate(req, on_event=on_event)
    finally:
        eng.lm.model = model
    assert r.report.restored == r.report.prompt_tokens - 1 and calls[0] == 1
    assert seen[0] == (0, 1)  # first token: after the last prompt token's forward only
    assert all(n <= i + 2 for i, n in seen)  # then at most one forward ahead
    assert r.finish_reason == "length" and len(calls) == len(r.tokens)  # none after the last token
    assert sorted({i for i, _ in seen}) == list(range(len(r.tokens)))  # an event for every token


def test_verify_and_clear_cache_compare_warm_with_cold(models):
    """What the debug panel's Verify and Clear cache rest on, with a warm side that provably
    restored: verify() re-runs cold and finds a warm regenerate identical (and a one-bit
    difference not); after clear_cache() a regenerate is cold and still equals the warm reply."""
    eng = make_engine(models["llama"])
    msgs = [{"role": "user", "content": QUESTIONS[1]}]
    eng.generate(request(msgs))
    req = request(msgs)
    warm = eng.generate(req)
    assert warm.report.restored == len(warm.prompt_ids) - 1 > 0
    cmp = eng.verify(req, warm)
    assert cmp.identical
    bent = dataclasses.replace(warm, logprobs=[warm.logprobs[0] + 2**-20, *warm.logprobs[1:]])
    cmp = eng.verify(req, bent)
    assert not cmp.identical and cmp.first_diff is None and cmp.max_logprob_diff > 0  # same tokens, other bits
    eng.clear_cache()
    assert eng.cache.metas() == []
    with forwards(eng) as log:
        cold = eng.generate(req)
    assert cold.report.restored == 0 and all(o in (None, 0) for o in log.calls[0][1])
    assert (cold.tokens, cold.logprobs) == (warm.tokens, warm.logprobs)
