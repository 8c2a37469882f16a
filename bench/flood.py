"""Normal requests while a reconnecting flood holds the server's connections (issue 29).

    PYTHONPATH=. .venv/bin/python bench/flood.py [--clients N] [--requests R]   # OpenBLAS preloaded

`python -m engine serve` on a tiny random-weight llama (tests/tiny_models.py), its descriptor
limit at 1,024 as on a desktop (so its connection cap is 768). N clients (default 2,000) each
connect, half of them send nothing and half send part of a request head, and reconnect as
soon as the server drops them, for as long as the run lasts. Meanwhile R (default 6) normal
chat requests (1 token, `Connection: close`) are sent one after another, once the flood has
made 2 x N connections (it is reconnecting in earnest; 60 s at most): each one's status and time to answer, with the flood running and, for the ratio,
without it. Bounded: every socket has a 60 s timeout; the flood stops with the last request.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.flood_clients import reconnect_flood  # noqa: E402
from tests.tiny_models import build_model  # noqa: E402

BODY = json.dumps({"messages": [{"role": "user", "content": "Why is the sky blue?"}], "max_tokens": 1,
                   "temperature": 0}).encode()


def _desktop_fd_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))


def normal_request(port: int) -> tuple[int, float]:
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(BODY)}\r\nConnection: close\r\n\r\n").encode()
    t0 = time.monotonic()
    data = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            s.sendall(head + BODY)
            while chunk := s.recv(65536):
                data += chunk
    except OSError:
        pass
    code = int(data.split()[1]) if data.startswith(b"HTTP/1.1 ") else 0
    return code, time.monotonic() - t0


def flood(port: int, clients: int, stop: "mp.synchronize.Event", connects: "mp.sharedctypes.Synchronized") -> None:
    """tests/flood_clients.py's flood in this process, counting connections in `connects`."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, clients + 256), hard))

    def connected() -> None:
        with connects.get_lock():
            connects.value += 1

    reconnect_flood(port, clients, stop.is_set, connected, retry_s=0.05, poll_s=0.5)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=2000)
    ap.add_argument("--requests", type=int, default=6)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp) / "llama", family="llama")
        p = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--model", str(model), "--port", "0",
                              "--no-cache"], stderr=subprocess.PIPE, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=_desktop_fd_limit)
        assert p.stderr is not None
        port = 0
        for line in p.stderr:
            if line.startswith("Verbatim server:") and " at http" in line:
                port = int(line.split(" at ", 1)[1].split()[0].rsplit(":", 1)[1].split("/")[0])
                break
        try:
            quiet = [normal_request(port) for _ in range(args.requests)]
            stop, connects = mp.Event(), mp.Value("l", 0)
            f = mp.Process(target=flood, args=(port, args.clients, stop, connects))
            f.start()
            end = time.monotonic() + 60
            while connects.value < 2 * args.clients and time.monotonic() < end:  # reconnecting in earnest
                time.sleep(0.1)
            warm = connects.value
            t0 = time.monotonic()
            loud = [normal_request(port) for _ in range(args.requests)]
            during = time.monotonic() - t0
            reconnects = connects.value
            stop.set()
            f.join(60)
            with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
                s.sendall(f"GET /verbatim/status HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
                          .encode())
                raw = b""
                while chunk := s.recv(65536):
                    raw += chunk
            conns = json.loads(raw.split(b"\r\n\r\n", 1)[1])["connections"]
        finally:
            p.terminate()
            p.wait(60)
    ok = sum(1 for c, _ in loud if c == 200)
    med_q, med_l = statistics.median(t for _, t in quiet), statistics.median(t for _, t in loud)
    print(f"{args.clients} reconnecting clients, {warm} connects before the first normal request, "
          f"{reconnects - warm} more during the {during:.1f} s of normal requests; server: {conns}")
    print(f"normal requests answered: {ok}/{len(loud)} with the flood (statuses {[c for c, _ in loud]}), "
          f"{sum(1 for c, _ in quiet if c == 200)}/{len(quiet)} without")
    print(f"median time to answer: {med_l:.2f} s with the flood, {med_q:.2f} s without "
          f"({med_l / med_q:.1f}x); slowest with the flood {max(t for _, t in loud):.2f} s")


if __name__ == "__main__":
    main()
