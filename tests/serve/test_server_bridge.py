"""The server generates through the engine bridge (engine/bridge.py), as the window does.

Every generation is a job of the bridge's own; its final event is delivered (the request's
place in the queue freed, the counts back at zero) whether the reply was read to the end, the
client left mid-stream, or the client stopped reading; a request whose client left while it
waited never reaches the engine; and the next reply is the same as before. Real engine, tiny
random-weight model, real HTTP on 127.0.0.1; every wait is on an event or a response.
"""

from __future__ import annotations

import http.client
import json
from typing import Any

import openai
import pytest

from engine.types import CancelToken
from tests.server_helpers import SKY, TIMEOUT, Server, chat, collect_stream, lps

MSGS = [{"role": "user", "content": "Tell me about the bridge."}]


def post(server: Server, body: dict[str, Any]) -> http.client.HTTPConnection:
    """Send a chat request on a connection of its own; the response is left unread."""
    conn = http.client.HTTPConnection("127.0.0.1", server.handle.port, timeout=TIMEOUT)
    conn.request("POST", "/v1/chat/completions", json.dumps({"model": server.model, **body}).encode(),
                 {"Content-Type": "application/json"})
    return conn


def sse(body: bytes) -> list[Any]:
    """The data objects of a server-sent event stream, up to [DONE] (which must be there)."""
    datas = [part.removeprefix(b"data: ") for part in body.split(b"\n\n") if part.startswith(b"data: ")]
    assert datas and datas[-1] == b"[DONE]", body[-200:]
    return [json.loads(d) for d in datas[:-1]]


def active_tokens(server: Server) -> list[CancelToken]:
    async def read() -> list[CancelToken]:
        return list(server.handle.state._active)

    return server.call(read())


def idle(server: Server, served: int) -> None:
    server.wait_state(lambda st: st.served == served and st.running == 0 and st.waiting == 0)


def test_every_generation_is_a_bridge_job_and_each_final_frees_its_place(server: Server) -> None:
    c = server.client()
    recording, state = server.recording, server.handle.state
    jobs, served = len(recording.jobs), state.served
    reference = chat(c, server.model, MSGS, logprobs=True, top_logprobs=2)
    text, logprobs, last, finish = collect_stream(chat(c, server.model, MSGS, logprobs=True, stream=True))
    assert text == reference.choices[0].message.content and logprobs == lps(reference) and finish
    with pytest.raises(openai.BadRequestError) as long:  # refused before prefill: a status code, no stream
        chat(c, server.model, [{"role": "user", "content": "word " * 5000}], stream=True)
    assert long.value.body["code"] == "context_length_exceeded"
    stream = chat(c, server.model, MSGS, max_tokens=3000, stream=True)
    for ch in stream:
        if ch.choices and ch.choices[0].delta.content:
            break
    stream.close()  # the client leaves mid-stream
    idle(server, served + 4)
    assert recording.results[-1].finish_reason == "cancelled" and len(recording.results[-1].tokens) < 3000
    # Each of the four ran as the bridge's job (not one the server made itself), and nothing more.
    assert [job.__module__ for job in recording.jobs[jobs:]] == ["engine.bridge"] * 4
    again = chat(c, server.model, MSGS, logprobs=True, top_logprobs=2)
    assert again.verbatim["token_ids"] == reference.verbatim["token_ids"] and lps(again) == lps(reference)


def test_a_request_whose_client_left_while_it_waited_never_reaches_the_engine(server: Server) -> None:
    c = server.client()
    reference = chat(c, server.model, MSGS)
    state = server.handle.state
    served, generations = state.served, len(server.recording.results)
    before = server.engine(lambda e: e.cache_stats())
    release = server.gate()  # the engine thread is busy: the request waits
    try:
        conn = post(server, {"messages": SKY, "max_tokens": 8, "stream": True})
        server.wait_state(lambda st: st.waiting == 1)
        (token,) = active_tokens(server)
        conn.close()  # the client leaves while its request waits
        assert token._event.wait(TIMEOUT)  # the server noticed: its generation is cancelled
    finally:
        release.set()
    idle(server, served + 1)
    assert len(server.recording.results) == generations  # no generation ran for it
    after = server.engine(lambda e: e.cache_stats())
    assert after["lookups"] == before["lookups"]  # not even a cache lookup
    again = chat(c, server.model, MSGS)
    assert again.verbatim["token_ids"] == reference.verbatim["token_ids"]


def test_the_final_event_is_delivered_while_the_client_is_not_reading(server: Server) -> None:
    c = server.client()
    body = {"messages": MSGS, "max_tokens": 400, "temperature": 0, "seed": 0}
    reference = chat(c, server.model, MSGS, max_tokens=400)
    served = server.handle.state.served
    conn = post(server, {**body, "stream": True, "stream_options": {"include_usage": True}})
    try:
        resp = conn.getresponse()  # the headers only: the stream itself is not read yet
        assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
        idle(server, served + 1)  # the generation ended and freed its place, nobody reading
        chunks = sse(resp.read())  # then everything is still there, in order, to the end
    finally:
        conn.close()
    content = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"])
    final = [ch for ch in chunks if ch["choices"] and ch["choices"][0]["finish_reason"]]
    assert content == reference.choices[0].message.content
    assert final[-1]["verbatim"]["token_ids"] == reference.verbatim["token_ids"]
    assert chunks[-1]["usage"]["completion_tokens"] == reference.usage.completion_tokens
