"""The generation loop as a generator: events out, the result as its return value, closing ends it."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.generate.loop import drain
from engine.types import PrefillProgress, TokenEvent
from tests.engine_helpers import make_engine, request

QUESTION = [{"role": "user", "content": "Explain how a prompt cache works in two sentences."}]


def _collect(events):
    seen = []
    return seen, drain(events, seen.append)


def test_stream_yields_progress_then_one_event_per_token_and_returns_the_result(tiny_model: Path) -> None:
    eng = make_engine(tiny_model, chunk=8)
    req = request(QUESTION, max_tokens=12)
    seen, result = _collect(eng.stream(req))
    progress = [e for e in seen if isinstance(e, PrefillProgress)]
    tokens = [e for e in seen if isinstance(e, TokenEvent)]
    n = result.report.prompt_tokens
    assert progress[0].done == 0 and progress[-1].done == n - 1 and all(p.total == n for p in progress)
    # progress moves at the chunk cuts (multiples of 8 and message starts), then to n - 1
    assert [p.done for p in progress[1:]] == [end for _, end in result.report.chunks[:-1]]
    assert all(e.done % 8 == 0 or e.done in result.report.message_starts for e in progress[1:-1])
    # every token once, in order, and the text of the events is the reply's text
    assert sorted({e.index for e in tokens}) == list(range(len(result.tokens)))
    assert "".join(e.text for e in tokens) == result.text
    # generate() is the same stream run to its end: same tokens, bit-equal logprobs (a fresh engine)
    other = make_engine(tiny_model, chunk=8).generate(req)
    assert other.tokens == result.tokens and other.logprobs == result.logprobs


def test_closing_mid_decode_stops_forwarding_and_keeps_what_a_regenerate_needs(tiny_model: Path) -> None:
    eng = make_engine(tiny_model, chunk=8)
    req = request(QUESTION, max_tokens=40)
    cold = make_engine(tiny_model, chunk=8).generate(req)
    model = eng.lm.model
    calls: list[int] = []

    class Counting:
        def __call__(self, x, cache=None):
            calls.append(x.shape[1])
            return model(x, cache=cache)

        def __getattr__(self, name):
            return getattr(model, name)

    eng.lm.model = Counting()
    events = eng.stream(req)
    for e in events:
        if isinstance(e, TokenEvent) and e.index == 2:
            break
    forwards_at_close = len(calls)
    events.close()
    assert len(calls) == forwards_at_close  # nothing runs after close
    assert forwards_at_close < len(cold.tokens)
    eng.lm.model = model
    # the pre-last state was kept: a regenerate restores prompt - 1 and equals the cold reply
    again = eng.generate(req)
    n = again.report.prompt_tokens
    assert again.report.restored == n - 1 and again.report.source == "memory"
    assert all(off == n - 1 for off in again.report.layer_offsets)
    assert again.tokens == cold.tokens and again.logprobs == cold.logprobs


def test_closing_mid_prefill_keeps_only_an_exact_aligned_prefix(tiny_model: Path) -> None:
    eng = make_engine(tiny_model, chunk=8)
    long_q = [{"role": "user", "content": " ".join(["Why is the sky blue?"] * 12)}]
    req = request(long_q, max_tokens=4)
    events = eng.stream(req)
    done = 0
    for e in events:
        if isinstance(e, PrefillProgress) and e.done >= 24:
            done = e.done
            break
    events.close()
    metas = eng.cache.metas()
    assert [m.length for m in metas] == [done] and done % 8 == 0
    assert metas[0].kind == "partial" and metas[0].canonical == done
    cold = make_engine(tiny_model, chunk=8).generate(req)
    warm = eng.generate(req)
    assert warm.report.restored == done
    assert warm.tokens == cold.tokens and warm.logprobs == cold.logprobs


@pytest.mark.parametrize("stop_after", [0, 5])
def test_a_closed_stream_leaves_no_write_hold_on_the_disk_tier(tiny_model: Path, tmp_path: Path, stop_after: int
                                                                ) -> None:
    eng = make_engine(tiny_model, chunk=8, use_disk=True, cache_dir=tmp_path)
    events = eng.stream(request(QUESTION, max_tokens=20))
    for i, _ in enumerate(events):
        if i >= stop_after:
            break
    events.close()
    disk = eng.cache.disk
    assert disk.queue.holds == 0  # the generation's hold on background writes ended with it
    assert disk.flush(timeout=60)
    # whatever the closed generation kept in memory also reached the disk tier
    assert {m.id for m in eng.cache.metas()} <= {m.id for m in disk.entries(eng.lm.key)}
