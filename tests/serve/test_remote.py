"""engine/remote.py against a real server on 2 ranks (tiny llama, ring backend on localhost)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from engine.bridge import EngineAPI
from engine.errors import EngineError
from engine.generate.loop import drain
from engine.remote import RemoteEngine
from engine.types import CancelToken, ContextInfo, Event, GenerationRequest, RestoreEvent, SamplerSettings, TokenEvent
from tests.cluster import Cluster, running

SKY = [{"role": "user", "content": "Why is the sky blue?"}]


@pytest.fixture
def cluster(tiny_model: Path, tmp_path: Path) -> Iterator[Cluster]:
    with running(str(tiny_model), 2, tmp_path) as c:
        yield c


def test_remote_engine_streams_reports_per_rank_verifies_and_sees_the_server_go(cluster: Cluster) -> None:
    eng = RemoteEngine(cluster.url)
    info = eng.load()
    assert info.key == cluster.get("/verbatim/model")["key"] and info.key
    assert eng.describe() == f"{Path(info.name).name} · 2 ranks at 127.0.0.1:{cluster.port}"
    with pytest.raises(EngineError, match="serves"):
        eng.load("some-other-model")

    req = GenerationRequest(SKY, SamplerSettings(seed=0, max_tokens=8))
    streamed: list[Event] = []
    first = drain(eng.stream(req), streamed.append)
    again = eng.generate(req)
    n = first.report.prompt_tokens
    # The server's restore first (verbatim.progress), then its tokens.
    assert isinstance(streamed[0], RestoreEvent) and streamed[0].report.prompt_tokens == n
    events = [e for e in streamed if isinstance(e, TokenEvent)]
    assert len(first.tokens) == 8 and all(t >= 0 for t in first.tokens)
    assert [e.logprob for e in events] == first.logprobs and "".join(e.text for e in events) == first.text
    assert again.tokens == first.tokens and again.logprobs == first.logprobs and again.text == first.text
    assert again.report.restored == n - 1 and again.report.source == "memory" and again.report.identical is True
    assert again.report.world_size == 2
    assert [(r["rank"], r["restored"], r["layer_offsets"]) for r in again.report.ranks] == [
        (0, n - 1, [n - 1] * 4), (1, n - 1, [n - 1] * 4)]

    # Verify against a cold run on the server ("verbatim": {"cache": false}).
    cold = eng.cold_run(req)
    assert cold.report.restored == 0 and cold.tokens == first.tokens and cold.logprobs == first.logprobs
    assert eng.verify(req, again).identical

    # The tokenizer on the server; the window's context meter counts with it (EngineAPI.measure).
    assert isinstance(eng, EngineAPI)
    assert len(eng.prompt_ids(SKY)) == n
    assert eng.measure(req) == ContextInfo(info.context_length, n)
    assert eng.measure(GenerationRequest(SKY, context_length=100)).limit == min(100, info.context_length or 100)
    assert "".join(eng.token_texts(first.tokens)) == first.text

    # Stopped after 3 tokens: the server stops too, and the next reply is still the same.
    cancel = CancelToken()
    seen: list[TokenEvent] = []

    def stop_after_three(e: object) -> None:
        if isinstance(e, TokenEvent):
            seen.append(e)
            if len(seen) == 3:
                cancel.cancel()

    stopped = drain(eng.stream(GenerationRequest(SKY, SamplerSettings(seed=0, max_tokens=3000)), cancel),
                    stop_after_three)
    assert stopped.finish_reason == "cancelled" and len(seen) == 3
    # The stream named every token's id: a stopped reply keeps them (and they are the reply's).
    assert [e.token for e in events] == first.tokens
    assert stopped.tokens == [e.token for e in seen] and all(t >= 0 for t in stopped.tokens)
    assert stopped.logprobs == [e.logprob for e in seen]
    after = eng.generate(req)
    assert after.tokens == first.tokens and after.logprobs == first.logprobs

    # The sampler's logit_bias goes to the server: the greedy first token banned, another comes.
    banned = GenerationRequest(SKY, SamplerSettings(seed=0, max_tokens=4, logit_bias={str(first.tokens[0]): -100}))
    assert eng.generate(banned).tokens[0] != first.tokens[0]

    # The server goes away: a clear error, nothing hangs.
    assert cluster.stop() == [0, 0], cluster.log()
    with pytest.raises(EngineError, match="cannot reach the server"):
        eng.generate(req)
