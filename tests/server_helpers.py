"""An in-process Verbatim server for tests: an engine executor and a server on
127.0.0.1:<ephemeral> on a loop thread of its own, recording each job it submits; and what tests
send it (the openai client's chat, plain HTTP, `python -m engine serve` as a process)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Generator, Optional

import openai
import pytest

from engine.engine import Engine
from engine.executor import EngineExecutor
from engine.serve.schema import ServedModel, template_reads
from engine.serve.server import ServerHandle
from engine.types import CancelToken, Event, GenerationRequest, GenerationResult

TIMEOUT = 120  # seconds: generous, only ever hit when something hangs
ROOT = Path(__file__).resolve().parents[1]


class RecordingEngine:
    """The engine as a server job sees it, recording what each generation returned."""

    def __init__(self, engine: Engine, results: list[GenerationResult]) -> None:
        self._engine, self._results = engine, results

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def stream(self, request: GenerationRequest, cancel: Optional[CancelToken] = None
               ) -> Generator[Event, None, GenerationResult]:
        result = yield from self._engine.stream(request, cancel)
        self._results.append(result)
        return result


class RecordingExecutor:
    """The engine executor, recording each job the server submits and what each generation
    returned (to see cancellations)."""

    def __init__(self, inner: EngineExecutor) -> None:
        self.inner = inner
        self.jobs: list[Callable[[Any], Any]] = []
        self.results: list[GenerationResult] = []

    def submit(self, fn: Callable[[Any], Any]) -> concurrent.futures.Future:
        self.jobs.append(fn)
        return self.inner.submit(lambda engine: fn(RecordingEngine(engine, self.results)))


class Server:
    """An engine executor + a server on 127.0.0.1:<ephemeral> on a loop thread of its own."""

    def __init__(self, folder: Path, cache_dir: Optional[Path], chunk: int = 8, **options: Any) -> None:
        self.executor = EngineExecutor(lambda: Engine(cache_dir=cache_dir, use_disk=cache_dir is not None, chunk=chunk))
        self.info = self.executor.submit(lambda e: e.load(str(folder))).result(TIMEOUT)
        self.recording = RecordingExecutor(self.executor)
        self.loop = asyncio.new_event_loop()
        reads = self.executor.submit(lambda e: template_reads(e.lm.tokenizer)).result(TIMEOUT)
        served = replace(ServedModel.of(self.info), template_reads=reads)
        self.handle = ServerHandle(self.recording, served, "127.0.0.1", 0, **options)
        self.thread = threading.Thread(target=self.loop.run_forever, name="server-loop", daemon=True)
        self.thread.start()
        self.url = self.call(self.handle.start())
        self.model = self.info.name

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(TIMEOUT)

    def client(self, **kw: Any) -> openai.OpenAI:
        kw.setdefault("api_key", "unused")
        return openai.OpenAI(base_url=self.url, max_retries=0, timeout=TIMEOUT, **kw)

    def engine(self, fn: Callable[[Engine], Any]) -> Any:
        return self.executor.submit(fn).result(TIMEOUT)

    def wait_state(self, pred: Callable[[Any], bool]) -> None:
        """Block until `pred(state)` holds (checked on the loop thread at every change)."""
        hit = threading.Event()

        def check(state: Any) -> None:
            if pred(state):
                hit.set()

        def subscribe() -> Callable[[], None]:
            check(self.handle.state)
            return self.handle.state.subscribe(check)

        unsub = asyncio.run_coroutine_threadsafe(_async(subscribe), self.loop).result(TIMEOUT)
        try:
            assert hit.wait(TIMEOUT), f"server state never matched: {self.handle.state.status()}"
        finally:
            self.loop.call_soon_threadsafe(unsub)

    def gate(self) -> threading.Event:
        """Hold the engine thread until the returned event is set (requests queue behind it)."""
        release, entered = threading.Event(), threading.Event()

        def hold(engine: Any) -> None:
            entered.set()
            release.wait(TIMEOUT)

        self.executor.submit(hold)
        assert entered.wait(TIMEOUT)
        return release

    def close(self) -> None:
        self.call(self.handle.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(TIMEOUT)
        self.loop.close()
        self.executor.shutdown()


async def _async(fn: Callable[[], Any]) -> Any:
    return fn()


# -- talking to a server ------------------------------------------------------------------------

SKY = [{"role": "user", "content": "Why is the sky blue?"}]


class Raw:
    """A plain HTTP response (urllib): for what the openai client will not send."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status_code = status
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


def http(url: str, content: Optional[bytes] = None, headers: Optional[dict[str, str]] = None) -> Raw:
    req = urllib.request.Request(url, data=content, headers=headers or {}, method="POST" if content is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
            return Raw(r.status, r.read())
    except urllib.error.HTTPError as e:
        return Raw(e.code, e.read())


def chat(client: openai.OpenAI, model: str, messages: list[dict[str, str]] = SKY, **kw: Any) -> Any:
    kw.setdefault("temperature", 0)
    kw.setdefault("seed", 0)
    kw.setdefault("max_tokens", 12)
    return client.chat.completions.create(model=model, messages=messages, **kw)


def lps(resp: Any) -> list[float]:
    return [t.logprob for t in resp.choices[0].logprobs.content]


def collect_stream(stream: Any) -> tuple[str, list[float], Any, Optional[str]]:
    """(content, logprobs, the last chunk with choices, finish_reason) of a chat stream."""
    text, logprobs, last, finish = [], [], None, None
    for ch in stream:
        if not ch.choices:
            continue
        c = ch.choices[0]
        text.append(c.delta.content or "")
        if c.logprobs is not None and c.logprobs.content:
            logprobs += [t.logprob for t in c.logprobs.content]
        if c.finish_reason is not None:
            last, finish = ch, c.finish_reason
    return "".join(text), logprobs, last, finish


def post(s: Server, path: str, body: dict[str, Any], headers: dict[str, str] | None = None,
         method: str = "POST") -> tuple[int, Any]:
    """A JSON request to PATH under the server's root, with key k1 unless HEADERS say otherwise:
    (status, the decoded body, or an event stream's text as it came)."""
    req = urllib.request.Request(s.url.rsplit("/v1", 1)[0] + path, data=json.dumps(body).encode() if body else None,
                                 method=method, headers={"Content-Type": "application/json",
                                                         **(headers or {"Authorization": "Bearer k1"})})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
            raw = r.read().decode()
            return r.status, raw if raw.startswith(("event:", "data:")) else json.loads(raw)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def spawn_serve(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """`python -m engine serve ARGS` from the repository root: the process and the URL it prints."""
    p = subprocess.Popen([sys.executable, "-m", "engine", "serve", *args], stderr=subprocess.PIPE, text=True,
                         env=env, cwd=ROOT)
    assert p.stderr is not None
    for line in p.stderr:  # ends at EOF if the server dies
        if line.startswith("Verbatim server:") and " at http" in line:
            return p, line.split(" at ", 1)[1].split()[0]
    p.wait(TIMEOUT)
    pytest.fail(f"server did not start (rc {p.returncode})")
