"""The server under a determined attacker (issue 29): each breakage reproduced on 127.0.0.1.

Unread replies (counted until closed, aborted after the write timeout), /verbatim/tokenize in
the admission queue (no slow-request kill while it waits; ids checked against the vocabulary),
a reconnecting flood that must not drop complete requests, /v1/models/<path> as no oracle, and
the validation gaps. Every wait is on the server's own counters or a socket, each with a
deadline that fails on an assertion (never a socket timeout).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any, Callable

from engine.serve.connections import IDLE, RECEIVING, ConnectionGuard, Limits, RequestScan
from engine.serve.guard import RateLimitedLog
from engine.serve.quote import quote
from tests.flood_clients import reconnect_flood
from tests.raw_http import Reply, chat_body, exchange, read_to_close, request_bytes
from tests.server_helpers import SKY, Server, http

DEADLINE = 60.0  # seconds: only reached when the server misbehaves, and then an assertion fails


def until(pred: Callable[[], bool], what: str, deadline: float = DEADLINE) -> None:
    """Poll `pred` until it holds; fail on an assertion naming `what` past the deadline."""
    end = time.monotonic() + deadline
    while not pred():
        assert time.monotonic() < end, f"never happened: {what}"
        time.sleep(0.05)


def status(s: Server) -> dict[str, Any]:
    return http(s.url.removesuffix("/v1") + "/verbatim/status").json()


def post(s: Server, path: str, body: Any) -> tuple[int, Any]:
    r = exchange(s.handle.port, request_bytes("POST", path, f"127.0.0.1:{s.handle.port}",
                                              {"Content-Type": "application/json"}, json.dumps(body).encode()))
    return r.status, r.json()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# -- 1. unread replies --------------------------------------------------------------------------


def test_replies_nobody_reads_are_counted_until_closed_and_aborted_after_the_write_timeout(
        tiny_model: Path) -> None:
    """Clients with a 1 KB receive buffer send a tokenize request (a reply of MBs), never read: the
    server counts each connection until its socket is really closed, aborts it after the write
    timeout, and holds no descriptor for it afterwards (issue 29: 'open: 1' with 131 held)."""
    s = Server(tiny_model, None, limits=Limits(idle_timeout=0.5, write_timeout=1.0))
    socks: list[socket.socket] = []
    try:
        port = s.handle.port
        texts = s.engine(lambda e: e.token_texts(list(range(len(e.lm.tokenizer._tokenizer)))))
        widest = max(range(len(texts)), key=lambda i: len(json.dumps(texts[i])))
        body = json.dumps({"tokens": [widest] * 65536}).encode()  # a reply of several MB
        one = request_bytes("POST", "/verbatim/tokenize", f"127.0.0.1:{port}",
                            {"Content-Type": "application/json"}, body, close=False)
        before = open_fds()
        for _ in range(2):
            c = socket.socket()
            c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            c.connect(("127.0.0.1", port))
            c.sendall(one)  # more than the kernel's buffers hold (send_buffer): the server must buffer
            socks.append(c)
        until(lambda: status(s)["connections"].get("unread", 0) >= 2, "2 unread replies aborted")
        conns = status(s)["connections"]
        assert conns["open"] <= 1 and conns["buffered"] == 0, conns  # only the status request itself
        # The server's ends are gone: only our own 2 client sockets are left open in this process.
        until(lambda: open_fds() <= before + 2, "the server's sockets closed")
        for c in socks:  # each was reset (aborted), not left open: reading ends, the reply cut short
            c.settimeout(DEADLINE)
            got = read_to_close(c)
            assert len(got) < 65536 * 8
    finally:
        for c in socks:
            c.close()
        s.close()


class _FakeTransport:
    def __init__(self, buffered: int) -> None:
        self.buffered, self.aborted, self.closed = buffered, False, False

    def get_extra_info(self, name: str) -> None:
        return None

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def is_closing(self) -> bool:
        return self.aborted or self.closed

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        self.closed = True


def test_unsent_reply_bytes_are_bounded_per_connection_and_in_all() -> None:
    """`max_buffered`: a connection holding more unsent bytes is aborted; `max_buffered_total`:
    the longest-paused ones go until all together fit; a fresh paused one within both stays."""
    import logging

    now = [100.0]
    guard = ConnectionGuard(Limits(write_timeout=30.0, max_buffered=1000, max_buffered_total=2500),
                            RateLimitedLog(logging.getLogger("test")), clock=lambda: now[0])
    conns = []
    for i, (size, paused) in enumerate([(1500, 90.0), (900, 91.0), (900, 92.0), (900, 93.0), (10, None)]):
        c = guard.factory(lambda: _Inner())()
        c.connection_made(_FakeTransport(size))  # type: ignore[arg-type]
        c.paused_since = paused
        conns.append(c)
    guard._check_unread(now[0])
    aborted = [c.transport.aborted for c in conns]  # type: ignore[union-attr]
    # #0 over its own bound; then 2700 left > 2500: the longest paused (#1) goes; #2, #3, #4 stay.
    assert aborted == [True, True, False, False, False]
    assert guard.unread == 2 and len(guard.open) == 3
    now[0] += 31.0  # past the write timeout: the paused ones go, the one writing freely stays
    guard._check_unread(now[0])
    assert [c.transport.aborted for c in conns] == [True, True, True, True, False]  # type: ignore[union-attr]


class _Inner:
    def connection_made(self, transport: Any) -> None: ...

    def data_received(self, data: bytes) -> None: ...

    def connection_lost(self, exc: Any) -> None: ...


def test_a_request_is_known_complete_from_its_bytes() -> None:
    scan = RequestScan()
    scan.feed(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n")
    assert not scan.complete
    scan.feed(b"\r\n{\"a\"")
    assert not scan.complete
    scan.feed(b":")
    assert scan.complete
    get = RequestScan()
    get.feed(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    assert get.complete
    chunked = RequestScan()
    chunked.feed(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
    assert not chunked.complete and chunked.unknown


# -- 2. tokenize goes through the queue ----------------------------------------------------------


def test_tokenize_waits_its_turn_in_the_queue_and_is_not_killed_as_slow(tiny_model: Path) -> None:
    """While the engine is busy, a tokenize request is admitted (counted as waiting), outlives
    the slow-request timeout, and is answered; one more than the queue holds gets 429; token ids
    past the vocabulary or past any integer the engine takes are a 400, not a 500."""
    s = Server(tiny_model, None, queue_limit=1, limits=Limits(request_timeout=0.5))
    try:
        release = s.gate()
        got: list[tuple[int, Any]] = []
        t = threading.Thread(target=lambda: got.append(post(s, "/verbatim/tokenize", {"messages": SKY})))
        t.start()
        try:
            until(lambda: s.handle.state.waiting == 1, "the tokenize request counted as waiting")
            guard = s.handle.connections
            assert guard is not None
            checks = guard.checks
            until(lambda: guard.checks >= checks + 8, "the watchdog past the request timeout")  # 8 x 0.125 s
            code, body = post(s, "/verbatim/tokenize", {"tokens": [1, 2]})
            assert code == 429 and body["error"]["code"] == "queue_full"
        finally:
            release.set()
        t.join(DEADLINE)
        expected = s.engine(lambda e: e.prompt_ids(SKY))
        assert got and got[0] == (200, {"ids": expected})
        conns = status(s)["connections"]
        assert conns["timed_out"] == 0, conns
        assert s.handle.state.status()["refused"] == 1 and s.handle.state.served >= 1
        vocab = s.engine(lambda e: len(e.lm.tokenizer._tokenizer))
        for bad in ([9223372036854775808], [vocab], [-1], [True]):
            code, body = post(s, "/verbatim/tokenize", {"tokens": bad})
            assert code == 400 and body["error"]["param"] == "tokens", (bad, body)
        code, body = post(s, "/verbatim/tokenize", {"tokens": [vocab - 1]})
        assert code == 200 and len(body["texts"]) == 1
    finally:
        s.close()


# -- 6. a reconnecting flood ----------------------------------------------------------------------


def _flood(port: int, clients: int, stop: threading.Event, counts: dict[str, int]) -> None:
    """tests/flood_clients.py's flood, counting its connections in `counts`."""

    def connected() -> None:
        counts["connects"] += 1

    reconnect_flood(port, clients, stop.is_set, connected)


def test_complete_requests_are_answered_while_a_flood_reconnects(tiny_model: Path) -> None:
    """200 clients reconnecting as soon as they are dropped, against a cap of 24 connections:
    six normal chat requests are all answered (a complete request is never the one evicted)."""
    s = Server(tiny_model, None, limits=Limits(max_connections=24))
    stop = threading.Event()
    counts = {"connects": 0}
    flood = threading.Thread(target=_flood, args=(s.handle.port, 200, stop, counts), daemon=True)
    try:
        flood.start()
        guard = s.handle.connections
        assert guard is not None
        until(lambda: guard.evicted >= 200, "the flood under way")
        port = s.handle.port
        replies = []
        for _ in range(6):
            with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE) as sock:
                sock.sendall(request_bytes("POST", "/v1/chat/completions", f"127.0.0.1:{port}",
                                           {"Content-Type": "application/json"}, chat_body(max_tokens=1)))
                replies.append(Reply(read_to_close(sock), True))
        assert [r.status for r in replies] == [200] * 6, [r.body[:200] for r in replies]
        assert all(len(r.json()["verbatim"]["token_ids"]) == 1 for r in replies)
        assert guard.stats()["open"] <= 24 + 1
    finally:
        stop.set()
        flood.join(DEADLINE)
        s.close()
    assert guard.evicted >= 200 and counts["connects"] > 200


def test_eviction_order_spares_complete_requests() -> None:
    import logging

    guard = ConnectionGuard(Limits(max_connections=2), RateLimitedLog(logging.getLogger("test")))
    made = []
    for data in (b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", b"POST / HTTP/1.1\r\nCont", None):
        c = guard.factory(lambda: _Inner())()
        c.connection_made(_FakeTransport(0))  # type: ignore[arg-type]
        if data:
            c.data_received(data)
        made.append(c)
    # The third connection evicted the half-open one (#1), not the complete one (#0), older.
    assert [c.transport.aborted for c in made] == [False, True, False]  # type: ignore[union-attr]
    assert made[0].phase == RECEIVING and made[0].complete and made[2].phase == IDLE


# -- 7. /v1/models/<path> is no oracle ----------------------------------------------------------


def test_models_by_path_is_not_an_oracle_but_the_path_still_names_the_model(tiny_model: Path) -> None:
    s = Server(tiny_model, None)
    try:
        base = s.url
        real = s.info.path  # a model folder that exists, as the server was given it
        answers = []
        for path in (real, "/home/no-such-user/models/" + Path(real).name, "/etc", "/definitely/not/here"):
            r = http(base + "/models/" + urllib.parse.quote(path, safe=""))
            err = r.json()["error"]
            answers.append((r.status_code, err["code"], err["message"].replace(quote(path), "<name>")))
        assert len(set(answers)) == 1 and answers[0][0] == 404, answers
        listed = http(base + "/models").json()["data"][0]
        assert http(base + "/models/" + listed["id"]).status_code == 200
        for alias in listed["aliases"]:
            assert http(base + "/models/" + urllib.parse.quote(alias, safe="")).status_code == 200
        code, body = post(s, "/v1/chat/completions",
                          {"model": s.info.path, "messages": SKY, "max_tokens": 1})
        assert code == 200 and len(body["verbatim"]["token_ids"]) == 1  # the path alias still works
    finally:
        s.close()


# -- 8. validation gaps ----------------------------------------------------------------------------


def test_fields_that_would_change_the_reply_inside_messages_are_refused_by_name(server: Server) -> None:
    for extra, param in [({"name": 5}, "messages[0].name"),  # a name is accepted (issue 47): a string
                         # tool fields only where they belong (an assistant's calls, a tool's result)
                         ({"tool_calls": [{"id": "x", "type": "function"}]}, "messages[0].tool_calls"),
                         ({"tool_call_id": "x"}, "messages[0].tool_call_id"),
                         ({"weight": 2}, "messages[0].weight")]:
        code, body = post(server, "/v1/chat/completions",
                          {"messages": [{**SKY[0], **extra}], "max_tokens": 1})
        assert code == 400 and body["error"]["param"] == param, body


def test_stream_options_without_stream_and_ambiguous_logit_bias_are_refused(server: Server) -> None:
    code, body = post(server, "/v1/chat/completions",
                      {"messages": SKY, "max_tokens": 1, "stream_options": {"include_usage": True}})
    assert code == 400 and body["error"]["param"] == "stream_options"
    code, body = post(server, "/v1/completions",
                      {"prompt": "x", "max_tokens": 1, "stream_options": {"include_usage": True}})
    assert code == 400 and body["error"]["param"] == "stream_options"
    for bias in ({"05": 1, "5": 2}, {"05": 1}, {"00": 1}):
        code, body = post(server, "/v1/chat/completions", {"messages": SKY, "max_tokens": 1, "logit_bias": bias})
        assert code == 400 and body["error"]["param"] == "logit_bias", body
    code, body = post(server, "/v1/chat/completions", {"messages": SKY, "max_tokens": 1, "logit_bias": {"0": 1}})
    assert code == 200


def test_error_messages_echo_only_a_short_escaped_prefix_of_the_input(server: Server) -> None:
    huge = "é" * 100_000 + "<script>"
    for body in ({"model": huge, "messages": SKY}, {huge: 1, "messages": SKY},
                 {"messages": [{"role": huge, "content": "x"}]},
                 {"messages": [{"role": "user", "content": "x", huge: 1}]},
                 {"messages": SKY, "verbatim": {huge: 1}}):
        code, out = post(server, "/v1/chat/completions", body)
        err = out["error"]
        assert code in (400, 404) and len(err["message"]) < 300 and len(err["param"] or "") < 100, code
        assert "<script>" not in err["message"] and "é" not in err["message"]
    for path, body in (("/verbatim/tokenize", {"messages": [{"role": huge, "content": "x"}]}),
                       ("/v1/chat/completions", {"messages": SKY, "logit_bias": {"5": huge}})):
        code, out = post(server, path, body)
        assert code == 400 and len(out["error"]["message"]) < 400, out["error"]["message"][:200]
        assert "<script>" not in out["error"]["message"]
    r = http(server.url + "/models/" + urllib.parse.quote("é" * 1000 + "<script>", safe=""))  # < 8 KB of URL
    assert r.status_code == 404 and len(r.body) < 500
