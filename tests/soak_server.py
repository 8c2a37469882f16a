"""Thousands of requests through one `python -m engine serve` process on 127.0.0.1: the request
mix of tests/serve/test_soak_server.py and bench/soak.py --server. Ten kinds in turn: chat replies
(plain and streamed), a stream the client leaves after its first chunk, a raw completion, the
model list and the status (on a kept-alive connection and on fresh ones), bad JSON (400), an
unknown path (404), half a request head and a hang-up. Each reply is checked; every read has a
deadline (a socket timeout only when the server hangs)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 120.0  # seconds: only reached when the server hangs
PROMPTS = ("Why is the sky blue?", "Name three rivers.", "What is a prompt cache?", "Say hello.")


def serve(model: Path, cache_dir: Path) -> tuple[subprocess.Popen, int]:
    """Start `python -m engine serve` on an ephemeral loopback port; (process, port) once it
    says where it listens."""
    p = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--model", str(model), "--port", "0",
                          "--cache-dir", str(cache_dir), "--chunk", "16"],
                         stderr=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ})
    assert p.stderr is not None
    for line in p.stderr:  # ends at EOF if the server dies
        if line.startswith("Verbatim server:") and " at http" in line:
            url = line.split(" at ", 1)[1].split()[0]
            return p, int(url.split(":")[2].split("/")[0])
    p.wait(TIMEOUT)
    raise AssertionError(f"the server did not start (rc {p.returncode})")


def stop(p: subprocess.Popen) -> str:
    """SIGTERM, then what it wrote to stderr after starting (it must exit 0)."""
    p.terminate()
    rest = p.stderr.read() if p.stderr else ""
    assert p.wait(TIMEOUT) == 0, rest
    return rest


class Requests:
    """The mix, one request per call of `one(i)`; counts what came back per kind."""

    KINDS = ("chat", "stream", "left", "completion", "models", "status", "bad_json", "not_found",
             "models_fresh", "half_head")

    def __init__(self, port: int, model: str) -> None:
        self.port, self.model = port, model
        self.kept = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)  # keep-alive
        self.done = {k: 0 for k in self.KINDS}

    def close(self) -> None:
        self.kept.close()

    def _kept(self, method: str, path: str, body: Any = None, raw: bytes | None = None) -> tuple[int, bytes]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = {"Content-Type": "application/json"} if data is not None else {}
        self.kept.request(method, path, body=data, headers=headers)
        r = self.kept.getresponse()
        return r.status, r.read()

    def _fresh(self, method: str, path: str, body: Any = None) -> http.client.HTTPResponse:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=TIMEOUT)
        data = json.dumps(body).encode() if body is not None else None
        c.request(method, path, body=data, headers={"Content-Type": "application/json", "Connection": "close"})
        return c.getresponse()  # the connection closes with the response

    def _chat(self, i: int, stream: bool) -> dict[str, Any]:
        return {"model": self.model, "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                "max_tokens": 4, "temperature": 0.8, "seed": i % 7, "stream": stream}

    def one(self, i: int) -> str:
        kind = self.KINDS[i % len(self.KINDS)]
        if kind == "chat":
            status, body = self._kept("POST", "/v1/chat/completions", self._chat(i, False))
            reply = json.loads(body)
            assert status == 200 and reply["usage"]["completion_tokens"] >= 1, body[:300]
        elif kind == "stream":
            status, body = self._kept("POST", "/v1/chat/completions", self._chat(i, True))
            assert status == 200 and body.rstrip().endswith(b"data: [DONE]"), body[-300:]
        elif kind == "left":  # the client goes after the first chunk: the server cancels, cleans up
            r = self._fresh("POST", "/v1/chat/completions", {**self._chat(i, True), "max_tokens": 64})
            assert r.status == 200 and r.read(6) == b"data: "
            r.close()
        elif kind == "completion":
            status, body = self._kept("POST", "/v1/completions",
                                      {"model": self.model, "prompt": PROMPTS[i % 4], "max_tokens": 2})
            assert status == 200 and json.loads(body)["choices"][0]["text"] is not None, body[:300]
        elif kind == "models":
            status, body = self._kept("GET", "/v1/models")
            assert status == 200 and json.loads(body)["data"][0]["id"] == self.model, body[:300]
        elif kind == "status":
            status, body = self._kept("GET", "/verbatim/status")
            assert status == 200 and "connections" in json.loads(body), body[:300]
        elif kind == "bad_json":
            status, body = self._kept("POST", "/v1/chat/completions", raw=b"{ not json")
            assert status == 400 and "error" in json.loads(body), body[:300]
        elif kind == "not_found":
            status, body = self._kept("GET", "/v1/nothing-here")
            assert status == 404, (status, body[:300])
        elif kind == "models_fresh":
            r = self._fresh("GET", "/v1/models")
            assert r.status == 200 and json.loads(r.read())["data"], r.status
            r.close()
        else:  # half a request head, then the client hangs up
            with socket.create_connection(("127.0.0.1", self.port), timeout=TIMEOUT) as s:
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
        self.done[kind] += 1
        return kind
