"""The local OpenAI-compatible server, checked with the real `openai` client on 127.0.0.1.

Servers run in-process on their own asyncio loop thread (an ephemeral port) over a real engine
executor and a tiny random-weight model; one test runs `python -m engine serve` itself (signals,
restart from disk). Every wait is on an event or a response, with a generous timeout.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, Optional

import openai
import pytest

from engine.serve.server import ServeError, check_bind
from tests.engine_helpers import require_openblas
from tests.server_helpers import SKY, TIMEOUT, Raw, Server, chat, collect_stream, http, lps, spawn_serve

@pytest.fixture(scope="module")
def disk_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(tiny_model, tmp_path_factory.mktemp("server-cache"))
    yield s
    s.close()


# -- the seed's acceptance -------------------------------------------------------------------


def test_same_request_twice_is_identical_and_restores_all_but_the_last_token(tiny_model: Path, tmp_path: Path) -> None:
    require_openblas()
    cache = tmp_path / "cache"
    s = Server(tiny_model, cache)
    try:
        c = s.client()
        first = chat(c, s.model, logprobs=True, top_logprobs=3, max_tokens=16)
        second = chat(c, s.model, logprobs=True, top_logprobs=3, max_tokens=16)
        sampled = [chat(c, s.model, temperature=0.8, seed=7, max_tokens=16, logprobs=True) for _ in range(2)]
    finally:
        s.close()
    p = first.usage.prompt_tokens
    assert first.usage.prompt_tokens_details.cached_tokens == 0 and first.verbatim["source"] is None
    assert second.choices[0].message.content == first.choices[0].message.content
    assert second.verbatim["token_ids"] == first.verbatim["token_ids"] and len(first.verbatim["token_ids"]) == 16
    assert lps(second) == lps(first)  # bit-equal floats
    assert [[(t.token, t.logprob) for t in e.top_logprobs] for e in second.choices[0].logprobs.content] == \
        [[(t.token, t.logprob) for t in e.top_logprobs] for e in first.choices[0].logprobs.content]
    assert second.usage.prompt_tokens_details.cached_tokens == p - 1
    assert second.verbatim["restored"] == p - 1 and second.verbatim["source"] == "memory"
    assert second.verbatim["layer_offsets"] == [p - 1] * len(second.verbatim["layer_offsets"])
    assert second.verbatim["seed"] == 0 and second.verbatim["mode"] == "exact"
    assert second.verbatim["identical_to_previous"] is True
    # Seeded sampling at T=0.8: the same across two requests.
    assert sampled[1].verbatim["token_ids"] == sampled[0].verbatim["token_ids"]
    assert lps(sampled[1]) == lps(sampled[0])
    assert sampled[0].verbatim["token_ids"] != first.verbatim["token_ids"]  # it did sample

    # A new server (and engine) on the same cache dir: restored from disk, identical.
    s = Server(tiny_model, cache)
    try:
        c = s.client()
        again = chat(c, s.model, logprobs=True, top_logprobs=3, max_tokens=16)
        resampled = chat(c, s.model, temperature=0.8, seed=7, max_tokens=16, logprobs=True)
    finally:
        s.close()
    assert again.verbatim["source"] == "disk"
    assert again.usage.prompt_tokens_details.cached_tokens == p - 1
    assert again.verbatim["layer_offsets"] == [p - 1] * len(again.verbatim["layer_offsets"])
    assert again.choices[0].message.content == first.choices[0].message.content
    assert again.verbatim["token_ids"] == first.verbatim["token_ids"] and lps(again) == lps(first)
    assert resampled.verbatim["token_ids"] == sampled[0].verbatim["token_ids"] and lps(resampled) == lps(sampled[0])


def test_cached_reply_equals_a_cold_run(disk_server: Server) -> None:
    require_openblas()
    c = disk_server.client()
    msgs = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Explain how a prompt cache works in two sentences."}]
    warm = [chat(c, disk_server.model, msgs, logprobs=True) for _ in range(2)]
    cold = chat(c, disk_server.model, msgs, logprobs=True, extra_body={"verbatim": {"cache": False}})
    assert warm[1].verbatim["restored"] == warm[1].usage.prompt_tokens - 1
    assert cold.verbatim["restored"] == 0 and cold.usage.prompt_tokens_details.cached_tokens == 0
    assert cold.verbatim["token_ids"] == warm[1].verbatim["token_ids"] and lps(cold) == lps(warm[1])


# -- streaming, stop strings, raw completions ------------------------------------------------------


def test_stream_and_non_stream_agree_token_for_token(disk_server: Server) -> None:
    c = disk_server.client()
    msgs = [{"role": "user", "content": "Tell me about café and naïve señor."}]
    full = chat(c, disk_server.model, msgs, logprobs=True, max_tokens=24, temperature=0.8, seed=3)
    text, logprobs, last, finish = collect_stream(
        chat(c, disk_server.model, msgs, logprobs=True, max_tokens=24, temperature=0.8, seed=3, stream=True))
    assert text == full.choices[0].message.content
    assert logprobs == lps(full) and len(logprobs) == 24
    assert last.verbatim["token_ids"] == full.verbatim["token_ids"]
    assert finish == full.choices[0].finish_reason == "length"
    assert last.usage.prompt_tokens_details.cached_tokens == full.usage.prompt_tokens - 1


def test_stop_strings_end_the_reply_before_them_streamed_or_not(disk_server: Server) -> None:
    c = disk_server.client()
    msgs = [{"role": "user", "content": "The quick brown fox"}]
    base = chat(c, disk_server.model, msgs, max_tokens=24, temperature=0.8, seed=11).choices[0].message.content
    assert len(base) >= 8, base
    stop = base[4:7]
    cut = base[: base.find(stop)]
    full = chat(c, disk_server.model, msgs, max_tokens=24, temperature=0.8, seed=11, stop=[stop, "\x00never"])
    assert full.choices[0].message.content == cut and full.choices[0].finish_reason == "stop"
    text, _, last, finish = collect_stream(
        chat(c, disk_server.model, msgs, max_tokens=24, temperature=0.8, seed=11, stop=stop, stream=True))
    assert text == cut and finish == "stop"


def test_completions_continue_raw_text_without_a_template(disk_server: Server) -> None:
    c = disk_server.client()
    prompt = "The capital of France is"
    ids = disk_server.engine(lambda e: list(e.lm.tokenizer.encode(prompt)))
    r = [c.completions.create(model=disk_server.model, prompt=prompt, temperature=0, seed=0, max_tokens=10, logprobs=2)
         for _ in range(2)]
    assert r[0].usage.prompt_tokens == len(ids) and r[0].verbatim["prompt_tokens"] == len(ids)
    assert r[1].choices[0].text == r[0].choices[0].text
    assert r[1].choices[0].logprobs.token_logprobs == r[0].choices[0].logprobs.token_logprobs
    assert r[1].usage.prompt_tokens_details.cached_tokens == len(ids) - 1
    assert len(r[0].choices[0].logprobs.top_logprobs[0]) == 2
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model=disk_server.model, prompt=prompt, temperature=0, seed=0, max_tokens=10, stream=True) if ch.choices)
    assert streamed == r[0].choices[0].text


def test_models_and_status_show_the_model_and_the_queue(disk_server: Server) -> None:
    c = disk_server.client()
    models = c.models.list().data
    assert [m.id for m in models] == [disk_server.model]
    status = http(disk_server.url.removesuffix("/v1") + "/verbatim/status").json()
    assert status["model"] == disk_server.model and status["url"] == disk_server.url
    assert status["queue"]["limit"] >= 20 and status["queue"]["waiting"] == 0


# -- bad input ------------------------------------------------------------------------------------


def test_bad_requests_get_openai_errors_and_cache_nothing(disk_server: Server) -> None:
    c = disk_server.client()
    before = disk_server.engine(lambda e: e.cache_stats())
    url = disk_server.url + "/chat/completions"

    def post(body: Any, raw: Optional[bytes] = None) -> Raw:
        content = raw if raw is not None else json.dumps(body).encode()
        return http(url, content, {"Content-Type": "application/json"})

    r = post(None, b'{"model": "x", "messages": [')
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    for body, param in [
        ({"messages": "hello"}, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"messages": SKY, "temperature": "hot"}, "temperature"),
        ({"messages": SKY, "max_tokens": 1.5}, "max_tokens"),
        ({"messages": SKY, "max_tokens": 0}, "max_tokens"),
        ({"messages": SKY, "stream": "yes"}, "stream"),
        ({"messages": SKY, "seed": -1}, "seed"),
        ({"messages": SKY, "n": 2}, "n"),
        ({"messages": SKY, "top_logprobs": 3}, "top_logprobs"),
        ({"messages": SKY, "stop": [1, 2]}, "stop"),
        ({"messages": SKY, "model": 5}, "model"),
    ]:
        r = post({"model": disk_server.model, **body} if "model" not in body else body)
        err = r.json()["error"]
        assert r.status_code == 400 and err["type"] == "invalid_request_error" and err["param"] == param, (body, err)
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model=disk_server.model, prompt=["a", "b"])
    with pytest.raises(openai.NotFoundError) as nf:
        chat(c, "no-such-model")
    assert nf.value.body["code"] == "model_not_found"
    # A prompt past the model's context (4096 tokens): the context policy's error, before prefill.
    long = [{"role": "user", "content": "0123456789 what comes next? " * 700}]
    with pytest.raises(openai.BadRequestError) as too_long:
        chat(c, disk_server.model, long)
    assert too_long.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):  # the same when streaming: an error, not a 200 stream
        chat(c, disk_server.model, long, stream=True)
    # A body over 8 MiB: 413.
    r = post({"model": disk_server.model, "messages": [{"role": "user", "content": "x" * (9 << 20)}]})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    with pytest.raises(openai.APIStatusError) as big:
        chat(c, disk_server.model, [{"role": "user", "content": "y" * (9 << 20)}])
    assert big.value.status_code == 413
    after = disk_server.engine(lambda e: e.cache_stats())
    assert after["memory_entries"] == before["memory_entries"] and after["lookups"] == before["lookups"]
    assert chat(c, disk_server.model).choices[0].message.content  # still serving


def test_api_key_is_required_when_set_and_off_loopback(tiny_model: Path) -> None:
    with pytest.raises(ServeError):
        check_bind("0.0.0.0", None)
    with pytest.raises(ServeError):
        check_bind("192.168.1.10", "")
    check_bind("0.0.0.0", "k")
    check_bind("::1", None)
    s = Server(tiny_model, None, api_key="s3cret")
    try:
        with pytest.raises(openai.AuthenticationError):
            s.client().models.list()
        with pytest.raises(openai.AuthenticationError):
            s.client(api_key="wrong").chat.completions.create(model=s.model, messages=SKY, max_tokens=2)
        r = http(s.url + "/models")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert chat(s.client(api_key="s3cret"), s.model, max_tokens=2).choices[0].message.content is not None
    finally:
        s.close()


# -- concurrency, queue, disconnects ------------------------------------------------------------


def test_twenty_concurrent_clients_get_their_own_replies_in_order(disk_server: Server) -> None:
    from tests.engine_helpers import QUESTIONS

    prompts = [[{"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} ({i})"}] for i in range(20)]
    # What each should get: the engine itself, one by one, no cache.
    from engine.types import GenerationRequest, SamplerSettings

    expected = [disk_server.engine(lambda e, m=m: e.generate(
        GenerationRequest(m, SamplerSettings(max_tokens=6, seed=i, temperature=0.8), use_cache=False)).tokens)
        for i, m in enumerate(prompts)]
    release = disk_server.gate()  # all 20 are admitted before any runs
    clients = [disk_server.client() for _ in prompts]
    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        futs = []
        for i, (cl, m) in enumerate(zip(clients, prompts)):
            futs.append(pool.submit(chat, cl, disk_server.model, m, max_tokens=6, seed=i, temperature=0.8))
            disk_server.wait_state(lambda st, n=i + 1: st.waiting >= n)  # admitted in this order
        status = http(disk_server.url.removesuffix("/v1") + "/verbatim/status").json()
        assert status["queue"]["waiting"] == 20 and status["queue"]["running"] == 0
        release.set()
        replies = [f.result(TIMEOUT) for f in futs]
    for i, r in enumerate(replies):
        assert r.verbatim["token_ids"] == expected[i], i
        assert r.choices[0].finish_reason == "length"
    admitted = [r.verbatim["queue"]["admitted"] for r in replies]
    started = [r.verbatim["queue"]["started"] for r in replies]
    assert admitted == sorted(admitted) and started == sorted(started)  # first come, first served
    disk_server.wait_state(lambda st: st.waiting == 0 and st.running == 0)


def test_a_full_queue_refuses_with_429(tiny_model: Path) -> None:
    s = Server(tiny_model, None, queue_limit=2)
    try:
        release = s.gate()
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            futs = []
            for i in range(2):
                futs.append(pool.submit(chat, s.client(), s.model, max_tokens=3))
                s.wait_state(lambda st, n=i + 1: st.waiting >= n)
            with pytest.raises(openai.RateLimitError) as full:
                chat(s.client(), s.model, max_tokens=3)
            assert full.value.body["code"] == "queue_full"
            release.set()
            assert all(f.result(TIMEOUT).choices[0].finish_reason == "length" for f in futs)
        assert s.handle.state.refused == 1
    finally:
        s.close()


def test_a_client_leaving_mid_stream_cancels_and_the_next_request_is_right(disk_server: Server) -> None:
    c = disk_server.client()
    msgs = [{"role": "user", "content": "Regenerate the answer, please."}]
    reference = chat(c, disk_server.model, msgs, logprobs=True)
    served = disk_server.handle.state.served
    n_results = len(disk_server.recording.results)
    stream = chat(c, disk_server.model, msgs, max_tokens=3000, stream=True)
    got = 0
    for ch in stream:
        if ch.choices and ch.choices[0].delta.content:
            got += 1
            if got == 3:
                break
    stream.close()  # the client disconnects
    disk_server.wait_state(lambda st: st.served == served + 1 and st.running == 0)
    done = disk_server.recording.results[n_results]
    assert done.finish_reason == "cancelled" and len(done.tokens) < 3000
    again = chat(c, disk_server.model, msgs, logprobs=True)
    assert again.verbatim["token_ids"] == reference.verbatim["token_ids"] and lps(again) == lps(reference)
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1


def test_stopping_the_server_ends_streams_and_generations(tiny_model: Path) -> None:
    s = Server(tiny_model, None)
    try:
        stream = chat(s.client(), s.model, max_tokens=3000, stream=True)
        it = iter(stream)
        next(it)
        s.call(s.handle.stop())
        with pytest.raises(openai.APIError, match="server is stopping"):
            for _ in it:
                pass
        s.wait_state(lambda st: st.running == 0 and st.waiting == 0)
        assert s.recording.results[-1].finish_reason == "cancelled"
    finally:
        s.close()


# -- the command line: `python -m engine serve`, signals, restart from disk ---------------------


def test_cli_serves_stops_on_signals_and_restarts_from_disk(tiny_model: Path, tmp_path: Path) -> None:
    env = {**os.environ}
    args = ["--model", str(tiny_model), "--port", "0", "--cache-dir", str(tmp_path / "cache"), "--chunk", "8"]
    bad = subprocess.run([sys.executable, "-m", "engine", "serve", *args, "--host", "0.0.0.0"], env=env,
                         capture_output=True, text=True, timeout=TIMEOUT, cwd=Path(__file__).resolve().parents[2])
    assert bad.returncode == 2 and "--api-key" in bad.stderr
    replies = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        p, url = spawn_serve(args, env)
        try:
            cl = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=TIMEOUT)
            replies.append(chat(cl, tiny_model.name, logprobs=True))
        finally:
            p.send_signal(sig)
            rest = p.stderr.read()
            assert p.wait(TIMEOUT) == 0, rest
            assert "stopped" in rest
    first, second = replies
    assert first.verbatim["source"] is None and second.verbatim["source"] == "disk"
    assert second.usage.prompt_tokens_details.cached_tokens == second.usage.prompt_tokens - 1
    assert second.verbatim["token_ids"] == first.verbatim["token_ids"] and lps(second) == lps(first)


def test_demo_model_through_python_m_engine_serve(tmp_path: Path) -> None:
    """The issue's acceptance on the real model: `python -m engine serve --model demo`, a ~600-token
    chat twice at T=0 / seed 0 (identical, all but the last token restored), then a new process on
    the same cache dir (restored from disk, identical)."""
    from engine.errors import ModelError
    from engine.models.resolve import demo_gguf_path

    try:
        demo_gguf_path()
    except ModelError as e:
        pytest.fail(f"the demo model is part of the set-up (make test installs it): {e}")
    require_openblas()
    words = ("The prompt cache keeps every layer's keys and values so that a regenerate of an unchanged "
             "conversation forwards only the last prompt token. ")
    msgs = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": words * 24 + "Summarise this in one sentence."}]
    args = ["--model", "demo", "--port", "0", "--cache-dir", str(tmp_path / "cache")]
    replies = []
    for run in range(2):
        p, url = spawn_serve(args, {**os.environ})
        try:
            cl = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=TIMEOUT)
            for _ in range(2 - run):
                replies.append(chat(cl, "demo", msgs, logprobs=True, max_tokens=8))
        finally:
            p.send_signal(signal.SIGINT)
            rest = p.stderr.read()
            assert p.wait(TIMEOUT) == 0, rest
    cold, warm, restarted = replies
    n = cold.usage.prompt_tokens
    assert n > 600 and cold.verbatim["source"] is None and cold.usage.prompt_tokens_details.cached_tokens == 0
    for r, source in ((warm, "memory"), (restarted, "disk")):
        assert r.verbatim["source"] == source
        assert r.usage.prompt_tokens_details.cached_tokens == n - 1
        assert r.verbatim["layer_offsets"] == [n - 1] * len(r.verbatim["layer_offsets"])
        assert r.choices[0].message.content == cold.choices[0].message.content
        assert r.verbatim["token_ids"] == cold.verbatim["token_ids"] and lps(r) == lps(cold)
