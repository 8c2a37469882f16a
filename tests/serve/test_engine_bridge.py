"""The engine bridge (engine/bridge.py): events in order, the final event always, errors raised
at the consumer. A real Engine on a tiny random-weight model, on its EngineExecutor thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from engine.bridge import Done, EngineAPI, Failed, engine_batches, engine_call, engine_events
from engine.engine import Engine
from engine.errors import EngineError, RequestError
from engine.executor import EngineExecutor
from engine.types import CancelToken, GenerationRequest, PrefillProgress, SamplerSettings, TokenEvent


@pytest.fixture(scope="module")
def executor(tiny_model: Path) -> Iterator[EngineExecutor]:
    ex = EngineExecutor(lambda: Engine(use_disk=False, chunk=8))
    ex.submit(lambda e: e.load(str(tiny_model))).result(timeout=120)
    yield ex
    assert ex.shutdown(timeout=60)


def request(max_tokens: int = 24, text: str = "Why is the sky blue?") -> GenerationRequest:
    return GenerationRequest([{"role": "user", "content": text}],
                             SamplerSettings(temperature=0.9, top_p=0.95, seed=11, max_tokens=max_tokens))


async def collect(executor: EngineExecutor, req: GenerationRequest, **kw: Any) -> list[Any]:
    return [e async for e in engine_events(executor, req, **kw)]


def test_the_engine_satisfies_the_interface() -> None:
    assert isinstance(Engine(use_disk=False), EngineAPI)


def test_events_arrive_in_order_and_end_with_the_result(executor: EngineExecutor) -> None:
    seen_on: list[str] = []
    observed: list[Any] = []

    def observe(event: Any) -> None:
        seen_on.append(threading.current_thread().name)
        observed.append(event)

    events = asyncio.run(collect(executor, request(), observe=observe))
    assert isinstance(events[-1], Done) and sum(isinstance(e, Done) for e in events) == 1
    result = events[-1].result
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    prefill = [e for e in events if isinstance(e, PrefillProgress)]
    assert [t.index for t in tokens] == list(range(len(tokens))) and len(tokens) == len(result.tokens) > 0
    assert [t.token for t in tokens] == result.tokens and [t.logprob for t in tokens] == result.logprobs
    assert "".join(t.text for t in tokens) == result.text
    assert prefill and events.index(prefill[-1]) < events.index(tokens[0])  # prefill before decode
    assert [p.done for p in prefill] == sorted(p.done for p in prefill) and prefill[-1].done < prefill[-1].total
    # The observer saw the very same events, in the same order, on the engine thread.
    assert observed == events and seen_on and all(n.startswith("verbatim-engine") for n in seen_on)


def test_tokens_come_in_batches_and_nothing_is_dropped(executor: EngineExecutor) -> None:
    async def run() -> list[list[Any]]:
        return [b async for b in engine_batches(executor, request(48), interval=10.0)]

    batches = asyncio.run(run())
    flat = [e for b in batches for e in b]
    tokens = [e for e in flat if isinstance(e, TokenEvent)]
    assert all(batches) and isinstance(flat[-1], Done) and isinstance(batches[-1][-1], Done)
    # A 10 s interval: the first event goes at once, then everything waits for the final one.
    assert len(batches) <= 3 < len(tokens)
    assert [t.token for t in tokens] == flat[-1].result.tokens


def test_a_cancelled_generation_still_ends_with_its_result(executor: EngineExecutor) -> None:
    cancel = CancelToken()

    async def run() -> list[Any]:
        out: list[Any] = []
        async for event in engine_events(executor, request(200), cancel, interval=0.0):
            out.append(event)
            if isinstance(event, TokenEvent) and event.index == 2:
                cancel.cancel()  # mid-stream, as Stop does
        return out

    events = asyncio.run(run())
    done = events[-1]
    assert isinstance(done, Done) and done.result.finish_reason == "cancelled"
    tokens = [e.token for e in events if isinstance(e, TokenEvent)]
    assert 3 <= len(tokens) < 200 and tokens == done.result.tokens


def test_an_engine_error_is_raised_at_the_consumer(executor: EngineExecutor, tmp_path: Path) -> None:
    bad = GenerationRequest([{"role": "user", "content": "hi"}], top_logprobs=99)
    with pytest.raises(RequestError, match="top_logprobs"):
        asyncio.run(collect(executor, bad))
    # An engine without a model, and one that could not start at all.
    empty = EngineExecutor(lambda: Engine(use_disk=False))
    with pytest.raises(EngineError, match="no model loaded"):
        asyncio.run(collect(empty, request()))
    assert empty.shutdown(timeout=30)

    def broken() -> Engine:
        raise EngineError("cache folder is not writable")

    dead = EngineExecutor(broken)
    with pytest.raises(EngineError, match="could not start"):
        asyncio.run(collect(dead, request()))
    assert dead.shutdown(timeout=30)
    # What `start` raises on the engine thread (before any generation) ends the stream with it.
    def changed(engine: Any) -> None:
        raise EngineError("the model changed while the request waited")

    observed: list[Any] = []
    with pytest.raises(EngineError, match="model changed"):
        asyncio.run(collect(executor, request(), start=changed, observe=observed.append))
    assert len(observed) == 1 and isinstance(observed[0], Failed)  # no event: it never generated
    # The executor still serves the next request after an error.
    assert asyncio.run(engine_call_stats(executor))["memory_entries"] >= 0


async def engine_call_stats(executor: EngineExecutor) -> dict[str, Any]:
    return await engine_call(executor, lambda e: e.cache_stats())


class FailedFromOutside:
    """An executor whose job's future fails from outside before the job runs (as the distributed
    leader fails the job in flight when a peer is lost); the job still runs afterwards."""

    def __init__(self, inner: EngineExecutor) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.ran: "concurrent.futures.Future[Any] | None" = None

    def submit(self, fn: Any) -> "concurrent.futures.Future[Any]":
        self.ran = self.inner.submit(lambda engine: (self.gate.wait(120), fn(engine))[1])
        outer: "concurrent.futures.Future[Any]" = concurrent.futures.Future()
        outer.set_exception(EngineError("the group failed"))
        return outer


def test_the_observer_sees_one_final_even_when_the_job_fails_outside_the_generation(executor: EngineExecutor) -> None:
    def broken() -> Engine:
        raise EngineError("cache folder is not writable")

    dead = EngineExecutor(broken)
    observed: list[Any] = []
    with pytest.raises(EngineError, match="could not start"):
        asyncio.run(collect(dead, request(), observe=observed.append))
    assert dead.shutdown(timeout=30)
    assert len(observed) == 1 and isinstance(observed[0], Failed) and "could not start" in str(observed[0].error)
    # Failed from outside: the consumer and the observer get that error, once; the job that runs
    # afterwards (cancelled: its consumer is gone) is observed no more.
    outside = FailedFromOutside(executor)
    observed.clear()
    with pytest.raises(EngineError, match="group failed"):
        asyncio.run(collect(outside, request(), observe=observed.append))
    outside.gate.set()
    assert outside.ran is not None
    outside.ran.result(timeout=120)
    assert len(observed) == 1 and isinstance(observed[0], Failed) and "group failed" in str(observed[0].error)


def test_an_observer_that_raises_on_the_done_fails_the_stream(executor: EngineExecutor) -> None:
    def observe(event: Any) -> None:
        if isinstance(event, Done):
            raise OSError("the reply could not be saved")

    with pytest.raises(OSError, match="could not be saved"):
        asyncio.run(collect(executor, request(4), observe=observe))
