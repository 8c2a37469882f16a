"""HTTP as bytes on a socket, for what a client library will not send (half-sent heads, forged
hosts, bodies held back): the request as bytes, one exchange read until the server closes, and
the raw reply parsed."""

from __future__ import annotations

import json
import socket
from typing import Any, Optional

from tests.server_helpers import SKY, TIMEOUT


class Reply:
    """A raw HTTP response: status, headers (lower-case names), body; `closed`: the server
    closed the connection after it."""

    def __init__(self, raw: bytes, closed: bool) -> None:
        head, _, self.body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1]) if lines and lines[0].startswith("HTTP/") else 0
        self.headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        self.closed = closed

    def json(self) -> Any:
        return json.loads(self.body)


def request_bytes(method: str, path: str, host: str, headers: Optional[dict[str, str]] = None,
                  body: bytes = b"", close: bool = True) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    hdrs = dict(headers or {})
    if body or method == "POST":
        hdrs.setdefault("Content-Length", str(len(body)))
    if close:
        hdrs.setdefault("Connection", "close")
    lines += [f"{k}: {v}" for k, v in hdrs.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def exchange(port: int, data: bytes) -> Reply:
    """Send `data`, read until the server closes the connection (every request here says
    'Connection: close', and refused ones are closed by the server anyway)."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as s:
        s.sendall(data)
        return Reply(read_to_close(s), True)


def read_to_close(s: socket.socket) -> bytes:
    buf = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        buf += chunk
    return buf


def chat_body(**kw: Any) -> bytes:
    return json.dumps({"messages": SKY, "max_tokens": 4, "temperature": 0, **kw}).encode()
