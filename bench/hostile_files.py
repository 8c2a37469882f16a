"""Hostile files sent to `python -m engine serve` (issue 49): how long each takes to be refused,
what the server's memory does meanwhile, and how long another client waits.

    PYTHONPATH=. .venv/bin/python bench/hostile_files.py [--code DIR] [--cases a,b] [--timeout S]

A server is started on 127.0.0.1 with the tiny random llama (tests/tiny_models.py). For each file
(tests/hostile_files.py builds them) one client sends it as a `file` part of a chat request;
while that request is in flight a second client alternates `GET /v1/models` and a 1-token chat
reply, one after the other. Reported per file: the answer (status, its first words), seconds to
it, the server process's peak resident memory above its level before the request, the reader
processes' peak (the server's children), and the longest and median wait of the other client.
`--code DIR` runs the server from another checkout (e.g. `git archive` of an older commit), to
measure the same files before the change.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import hostile_files as H  # noqa: E402


def cases() -> dict[str, tuple[str, bytes, str]]:
    return {
        "pdf-text-lines": ("lines.pdf", H.pdf_of_text_lines(), "application/pdf"),
        "pdf-no-ops": ("noop.pdf", H.pdf_of_no_ops(), "application/pdf"),
        "docx-1gib": ("bomb.docx", H.docx_inflating_to(1 << 30), "application/vnd.openxmlformats-officedocument."
                      "wordprocessingml.document"),
        "docx-empty-paragraphs": ("paras.docx", H.docx_of_empty_paragraphs(), "application/octet-stream"),
        "good-docx": ("contract.docx", H.word(H.p("Clause 1. Pay within thirty days.")), "application/octet-stream"),
    }


def serve(model: Path, cache: Path, code: Path) -> tuple[subprocess.Popen, int]:
    p = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--model", str(model), "--port", "0",
                          "--cache-dir", str(cache), "--chunk", "16"], stderr=subprocess.PIPE, text=True,
                         cwd=code, env={**os.environ, "PYTHONPATH": str(code)})
    assert p.stderr is not None
    for line in p.stderr:
        if line.startswith("Verbatim server:") and " at http" in line:
            threading.Thread(target=p.stderr.read, daemon=True).start()  # drain
            return p, int(line.split(" at ", 1)[1].split()[0].split(":")[2].split("/")[0])
    raise SystemExit(f"the server did not start (rc {p.wait()})")


def request(port: int, method: str, path: str, body: Any = None, timeout: float = 600) -> tuple[int, Any]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = json.dumps(body).encode() if body is not None else None
    c.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
    r = c.getresponse()
    out = r.status, json.loads(r.read())
    c.close()
    return out


def rss(pid: int) -> tuple[int, int]:
    """(the process's resident bytes, its children's together)."""
    import psutil

    try:
        p = psutil.Process(pid)
        kids = sum(k.memory_info().rss for k in p.children(recursive=True) if k.is_running())
        return p.memory_info().rss, kids
    except psutil.Error:
        return 0, 0


def one(port: int, pid: int, model: str, name: str, data: bytes, mime: str, timeout: float) -> dict[str, Any]:
    body = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": [
        {"type": "file", "file": {"filename": name, "file_data": f"data:{mime};base64," + base64.b64encode(data).decode()}},
        {"type": "text", "text": "Summarise."}]}]}
    base, _ = rss(pid)
    peaks = [base, 0]  # the server's, its readers'
    done = threading.Event()
    answer: dict[str, Any] = {}

    def sample() -> None:  # on a thread of its own: the other client may be stuck waiting
        while not done.wait(0.02):
            now, kids = rss(pid)
            peaks[0], peaks[1] = max(peaks[0], now), max(peaks[1], kids)

    def bad() -> None:
        t = time.perf_counter()
        try:
            status, reply = request(port, "POST", "/v1/chat/completions", body, timeout)
            answer.update(status=status, text=(reply.get("error") or {}).get("message") or "accepted")
        except Exception as e:  # noqa: BLE001  (a timeout is a result here)
            answer.update(status=None, text=f"{type(e).__name__}")
        answer["s"] = time.perf_counter() - t
        done.set()

    threading.Thread(target=bad, daemon=True).start()
    threading.Thread(target=sample, daemon=True).start()
    waits: list[float] = []
    k = 0
    while not done.is_set():
        t = time.perf_counter()
        try:
            if k % 2 == 0:
                request(port, "GET", "/v1/models", timeout=timeout)
            else:
                request(port, "POST", "/v1/chat/completions", {"model": model, "max_tokens": 1, "messages": [
                    {"role": "user", "content": "Hi"}]}, timeout=timeout)
        except TimeoutError:
            pass  # it waited the whole timeout: counted as that
        waits.append(time.perf_counter() - t)
        k += 1
    done.wait()
    now, _ = rss(pid)
    return {"answer": f"{answer.get('status')} {answer.get('text', '')[:70]}", "s": answer.get("s", 0.0),
            "server_mib": (max(peaks[0], now) - base) / 2**20, "after_mib": (now - base) / 2**20,
            "reader_mib": peaks[1] / 2**20, "wait_max": max(waits, default=0.0),
            "wait_median": statistics.median(waits) if waits else 0.0, "others": len(waits)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--code", type=Path, default=ROOT, help="the checkout the server runs from")
    ap.add_argument("--cases", default="", help="comma-separated subset")
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args()
    from tests.engine_helpers import model_dir

    tmp = Path(tempfile.mkdtemp(prefix="hostile-bench-"))
    model = model_dir(tmp / "models", "llama")
    p, port = serve(model, tmp / "cache", args.code)
    try:
        request(port, "POST", "/v1/chat/completions", {"model": model.name, "max_tokens": 1,
                                                       "messages": [{"role": "user", "content": "warm up"}]})
        print("| file | size | answer | s | server RSS peak (+MiB) | after (+MiB) | reader peak (MiB) | "
              "other client: longest wait (s) | median (s) | its requests |")
        print("|---" * 10 + "|")
        chosen = [c for c in args.cases.split(",") if c] or list(cases())
        for key, (name, data, mime) in cases().items():
            if key not in chosen:
                continue
            r = one(port, p.pid, model.name, name, data, mime, args.timeout)
            print(f"| {key} | {len(data) / 1024:,.0f} KiB | {r['answer']} | {r['s']:.2f} | {r['server_mib']:,.0f} | "
                  f"{r['after_mib']:,.0f} | {r['reader_mib']:,.0f} | {r['wait_max']:.2f} | {r['wait_median']:.3f} | "
                  f"{r['others']} |", flush=True)
    finally:
        p.terminate()
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:  # an older server still busy reading a file on its loop
            p.kill()
            p.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
