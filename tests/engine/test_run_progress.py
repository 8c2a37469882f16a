"""A run in progress can be shown, and a stopped run's report states what it did (issue 50, item 5).

Right after the restore, before the first prefill chunk, the stream yields a `RestoreEvent`: what
was restored, from which snapshot, every layer's offset, the plan's declines and the prefill
planned; in process, through the bridge, and from a server to a remote engine. A run stopped
before decode reports the forwards it made (no more, no fewer) and the seed it used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from engine.generate.loop import drain
from engine.types import CancelToken, PrefillProgress, RestoreEvent, TokenEvent
from tests.engine_helpers import forwards, make_engine, request

QUESTION = [{"role": "user", "content": "Explain how a prompt cache works in two sentences."}]
LONG = [{"role": "user", "content": " ".join(["Why is the sky blue?"] * 12)}]
SEED = 1234567


def _turn_two(eng: Any) -> list[dict]:
    first = eng.generate(request(QUESTION, max_tokens=8))
    return QUESTION + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And why?"}]


def test_the_restore_event_comes_before_any_prefill_forward_and_says_what_the_report_will(tiny_model: Path) -> None:
    eng = make_engine(tiny_model, chunk=8)
    req = request(_turn_two(eng), max_tokens=6)
    seen: list[Any] = []
    with forwards(eng) as log:
        def on_event(e: Any) -> None:
            seen.append((e, len(log.calls)))

        result = drain(eng.stream(req), on_event)
    (restore, forwarded_then), *rest = seen
    assert isinstance(restore, RestoreEvent) and forwarded_then == 0  # before the first forward
    assert isinstance(rest[0][0], PrefillProgress) and rest[0][0].done == restore.report.restored
    assert sum(isinstance(e, RestoreEvent) for e, _ in seen) == 1
    final, r = result.report, restore.report
    # A warm turn: restored from memory, from a named snapshot, and the report agrees on all of it.
    assert r.restored > 0 and r.source == "memory" and r.snapshot_id is not None
    assert (r.restored, r.matched, r.stored, r.partial, r.source, r.snapshot_id) == (
        final.restored, final.matched, final.stored, final.partial, final.source, final.snapshot_id)
    assert r.layer_offsets == final.layer_offsets == [r.restored] * len(r.layers)
    assert r.declines == final.declines and r.context == final.context and r.seed == final.seed
    assert r.prompt_tokens == final.prompt_tokens and r.message_starts == final.message_starts
    # What it planned is what it forwarded: the chunks, then the last prompt token alone.
    assert restore.planned == final.chunks and restore.planned_tokens == final.prefill_tokens
    assert [tuple(c) for c in restore.planned] == log.spans[: len(restore.planned)]
    # Nothing done yet at the restore: no forwards, no snapshots, no timings.
    assert (r.prefill_tokens, r.chunks, r.snapshots_stored, r.ttft_s) == (0, [], [], 0.0)
    # What a view shows as the prefill goes on: the forwards made so far, then all of them.
    for e, _ in rest:
        if isinstance(e, PrefillProgress):
            now = restore.report_at(e.done)
            assert now.prefill_tokens == e.done - r.restored and now.chunks == final.chunks[: len(now.chunks)]
    decoding = restore.report_at(final.prompt_tokens - 1, decoding=True)
    assert (decoding.chunks, decoding.prefill_tokens) == (final.chunks, final.prefill_tokens)
    assert restore.report.chunks == []  # a copy each time


def test_a_cold_run_says_so_at_the_restore(tiny_model: Path) -> None:
    eng = make_engine(tiny_model, chunk=8)
    events: list[Any] = []
    result = drain(eng.stream(request(QUESTION, max_tokens=4)), events.append)
    restore = events[0]
    assert isinstance(restore, RestoreEvent)
    assert (restore.report.restored, restore.report.source, restore.report.snapshot_id) == (0, None, None)
    assert restore.planned[0][0] == 0 and restore.planned[-1] == [result.report.prompt_tokens - 1,
                                                                    result.report.prompt_tokens]


def _stop_when(eng: Any, req: Any, done_at_least: int, seen: Any = None) -> tuple[Any, int, list[tuple[int, int]]]:
    """Run `req`, stopping once prefill reports `done_at_least` tokens in the cache: (result, the
    last progress seen, the forwards the model made); `seen` (a list) gets every event."""
    cancel = CancelToken()
    last = 0

    def on_event(e: Any) -> None:
        nonlocal last
        if seen is not None:
            seen.append(e)
        if isinstance(e, PrefillProgress):
            last = e.done
            if e.done >= done_at_least:
                cancel.cancel()

    with forwards(eng) as log:
        result = eng.generate(req, on_event, cancel)
    return result, last, log.spans


def test_a_run_stopped_mid_prefill_reports_the_tokens_it_forwarded_and_its_seed(tiny_model: Path) -> None:
    eng = make_engine(tiny_model, chunk=8)
    req = request(LONG, max_tokens=4, temperature=0.7, seed=SEED)
    seen: list[Any] = []
    result, done, spans = _stop_when(eng, req, 24, seen)
    r = result.report
    n = r.prompt_tokens
    assert result.finish_reason == "cancelled" and 24 <= done < n - 1  # stopped inside prefill
    # The forwards it made, as the model saw them, and their tokens: not 0.
    assert [tuple(c) for c in r.chunks] == spans and spans[-1][1] == done
    assert r.prefill_tokens == done == sum(b - a for a, b in r.chunks)
    assert [(s["kind"], s["length"]) for s in r.snapshots_stored] == [("partial", done)]
    assert r.prefill_tps > 0 and r.ttft_s == 0.0  # its prefill's own rate; no first token
    # What a view showed at the last progress is what the report says.
    restore = next(e for e in seen if isinstance(e, RestoreEvent))
    assert (restore.report_at(done).chunks, restore.report_at(done).prefill_tokens) == (r.chunks, r.prefill_tokens)
    # The seed it used, the request's (a random one in the app), in the report and the result.
    assert r.seed == result.seed == SEED and r.sampler["seed"] == SEED


def test_a_run_stopped_after_its_prefill_never_forwarded_the_last_prompt_token(tiny_model: Path) -> None:
    """Stopped once the cache holds prompt[:-1]: decode never ran, so the last prompt token was not
    forwarded, and the report does not say it was."""
    eng = make_engine(tiny_model, chunk=8)
    req = request(LONG, max_tokens=4, seed=SEED)
    n = eng.measure(req).prompt_tokens
    result, done, spans = _stop_when(eng, req, n - 1)
    r = result.report
    assert result.finish_reason == "cancelled" and result.tokens == [] and done == n - 1
    assert [tuple(c) for c in r.chunks] == spans and spans[-1] != (n - 1, n)
    assert r.prefill_tokens == n - 1 and r.seed == SEED


# -- through the bridge and a server ----------------------------------------------------------


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[Any]:
    from tests.server_helpers import Server

    s = Server(tiny_model, None, chunk=8)
    yield s
    s.close()


def test_the_bridge_delivers_the_restore_event_first(tiny_model: Path) -> None:
    import asyncio

    from engine.bridge import Done, engine_events
    from engine.engine import Engine
    from engine.executor import EngineExecutor

    ex = EngineExecutor(lambda: Engine(use_disk=False, chunk=8))
    try:
        ex.submit(lambda e: e.load(str(tiny_model))).result(timeout=120)

        async def run() -> list[Any]:
            return [e async for e in engine_events(ex, request(QUESTION, max_tokens=4))]

        events = asyncio.run(run())
    finally:
        assert ex.shutdown(timeout=60)
    assert isinstance(events[0], RestoreEvent) and isinstance(events[-1], Done)
    assert events[0].planned == events[-1].result.report.chunks


def test_a_remote_engine_yields_the_servers_restore_and_progress(server: Any) -> None:
    from engine.remote import RemoteEngine

    remote = RemoteEngine(server.url.removesuffix("/v1"))
    remote.load()
    req = request(QUESTION, max_tokens=6, seed=SEED, temperature=0.5)
    remote.generate(req)  # the server's cache now holds this prompt: the next one restores n - 1
    events: list[Any] = []
    result = drain(remote.stream(req), events.append)
    restore = next(e for e in events if isinstance(e, RestoreEvent))
    progress = [e for e in events if isinstance(e, PrefillProgress)]
    first_token = next(i for i, e in enumerate(events) if isinstance(e, TokenEvent))
    assert events.index(restore) < events.index(progress[0]) < first_token
    n = result.report.prompt_tokens
    r = restore.report
    assert (r.restored, r.source, r.snapshot_id, r.layer_offsets) == (
        n - 1, "memory", result.report.snapshot_id, result.report.layer_offsets)
    assert restore.planned == result.report.chunks == [[n - 1, n]] and r.seed == SEED
    assert progress[0].done == n - 1 and all(p.total == n for p in progress)


def test_a_remote_run_stopped_mid_prefill_reports_what_the_server_did_and_its_seed(server: Any) -> None:
    from engine.remote import RemoteEngine

    remote = RemoteEngine(server.url.removesuffix("/v1"))
    remote.load()
    req = request([{"role": "user", "content": " ".join(["The quick brown fox."] * 30)}], max_tokens=4,
                  temperature=0.7, seed=SEED)
    cancel = CancelToken()
    seen: list[Any] = []

    def on_event(e: Any) -> None:
        seen.append(e)
        if isinstance(e, PrefillProgress) and e.done >= 16:
            cancel.cancel()

    result = drain(remote.stream(req, cancel), on_event)
    r = result.report
    done = [e.done for e in seen if isinstance(e, PrefillProgress)][-1]
    assert result.finish_reason == "cancelled" and result.tokens == []
    assert isinstance(seen[0], RestoreEvent) and r.prompt_tokens == seen[0].report.prompt_tokens > done
    assert r.prefill_tokens == done - r.restored == sum(b - a for a, b in r.chunks) and r.chunks[-1][1] == done
    assert r.seed == result.seed == SEED and r.mode == "exact"


def test_the_progress_chunks_are_sent_only_when_asked(server: Any) -> None:
    """An OpenAI client that did not ask gets no chunk without choices but the usage one."""
    stream = server.client().chat.completions.create(model=server.model, messages=QUESTION, max_tokens=3,
                                                     stream=True)
    chunks = list(stream)
    assert chunks and all(c.choices for c in chunks)
    asked = server.client().chat.completions.create(model=server.model, messages=QUESTION, max_tokens=3,
                                                    stream=True, extra_body={"verbatim": {"progress": True}})
    extra = [c.verbatim for c in asked if not c.choices]
    assert "restore" in extra[0] and "planned" in extra[0]["restore"]
    assert all("prefill" in v for v in extra[1:]) and extra[1]["prefill"]["done"] == extra[0]["restore"]["restored"]
