"""A loopback HTTP proxy that records every exchange between a client library and the server.

The conformance suite (tests/serve/test_agent_clients.py) points each client library at this proxy, so
one recorder sees the exact bytes every library sent and got, whichever HTTP stack it uses
(httpx, httpx2, aiohttp). Responses pass through as they arrive (a streamed reply stays streamed),
close-delimited: the proxy answers each request on a connection of its own. Bounded: loopback only,
one upstream, a timeout on every socket, stopped by `close()`.
"""

from __future__ import annotations

import http.client
import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional
from urllib.parse import urlsplit

TIMEOUT = 300.0
# Per-response fields that differ by design between two identical requests: a fresh id, the
# clock, and what the cache did (`usage`: its cached_tokens; `verbatim`: the cache report, timings);
# the clock and the cache's figures at any depth too (a Responses stream nests its response object
# in its events). Everything else of a reply (content, tool calls and their ids, logprobs, finish)
# must be byte-identical.
VOLATILE = ("id", "created", "created_at", "usage", "verbatim")
NESTED_VOLATILE = ("created_at", "usage", "verbatim")


@dataclass
class Exchange:
    method: str
    path: str
    request: bytes
    status: int
    response: bytes

    def request_json(self) -> Any:
        return json.loads(self.request) if self.request else None

    def events(self) -> list[Any]:
        """The reply as JSON objects: one for a plain reply, each `data:` event of a stream."""
        text = self.response.decode()
        if not text.lstrip().startswith(("data:", "event:")):  # a stream: `data:` lines (after `event:` ones)
            return [json.loads(text)]
        out = []
        for line in text.splitlines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                out.append(json.loads(line[5:]))
        return out

    def stable(self) -> str:
        """The reply with its volatile fields blanked: equal for byte-identical replies."""
        return json.dumps([{k: _blanked(v) for k, v in e.items() if k not in VOLATILE} if isinstance(e, dict) else e
                           for e in self.events()])


def _blanked(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _blanked(v) for k, v in value.items() if k not in NESTED_VOLATILE}
    if isinstance(value, list):
        return [_blanked(v) for v in value]
    return value


class RecordingProxy:
    """127.0.0.1:<ephemeral> forwarding to `upstream` (http://host:port/...)."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        # Exchanges still being relayed: a client may have read a whole stream before the proxy
        # has seen the upstream close and recorded it.
        self._busy = 0
        self._idle = threading.Condition(self._lock)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # close-delimited replies: a stream passes through as is
            timeout = TIMEOUT

            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                with proxy._lock:
                    proxy._busy += 1
                try:
                    self._relay()
                finally:
                    with proxy._lock:
                        proxy._busy -= 1
                        proxy._idle.notify_all()

            def _relay(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "connection", "content-length", "accept-encoding")}
                conn = http.client.HTTPConnection(proxy.host, proxy.port, timeout=TIMEOUT)
                try:
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    resp = conn.getresponse()
                    self.send_response(resp.status)
                    for k, v in resp.getheaders():
                        if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                            self.send_header(k, v)
                    self.send_header("Connection", "close")
                    self.end_headers()
                    got = bytearray()
                    while chunk := resp.read1(65536):
                        got += chunk
                        self.wfile.write(chunk)
                        self.wfile.flush()
                finally:
                    conn.close()
                with proxy._lock:
                    proxy.exchanges.append(Exchange(self.command, self.path, body, resp.status, bytes(got)))

            do_GET = do_POST = do_DELETE = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="recording-proxy", daemon=True)
        self._thread.start()
        path = parts.path.rstrip("/")
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def mark(self) -> int:
        """How many exchanges were recorded, once every one in flight is (call it between runs)."""
        with self._idle:
            self._idle.wait_for(lambda: self._busy == 0, TIMEOUT)
            return len(self.exchanges)

    def since(self, mark: int, path_suffix: Optional[str] = "/chat/completions") -> list[Exchange]:
        """The exchanges recorded after `mark` (once every one in flight is), on that path."""
        with self._idle:
            self._idle.wait_for(lambda: self._busy == 0, TIMEOUT)
            got = self.exchanges[mark:]
        return [x for x in got if path_suffix is None or x.path.split("?")[0].endswith(path_suffix)]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(TIMEOUT)
