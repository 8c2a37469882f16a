"""An engine on a Verbatim server, over HTTP: what the window uses of `Engine`, remotely.

`RemoteEngine(url)` talks to `python -m engine serve` (one process, or rank 0 of several under
mlx.launch) with the standard library only: OpenAI-style requests, server-sent events for the
stream, and the `verbatim` object of the last chunk for the report (per rank in a distributed
run). It runs on the engine thread like the in-process Engine (its calls block).

What differs from the in-process engine, by necessity:
- Token ids come with the stream (`"verbatim": {"token_ids": true}`: each chunk names its
  tokens' ids), so a reply stopped part way keeps its ids like an in-process one.
- So do the restore and the prefill's progress (`"verbatim": {"progress": true}`): the stream
  yields the server's `RestoreEvent` and `PrefillProgress`, and a reply stopped part way
  reports what the server did as far as the stream told it (restore, forwards, seed).
- `top_logprobs` alternatives come by text only, so they are not reported as ids.
- `load(spec)` does not load anything: it connects and checks the server serves `spec`.
- `clear_cache` is refused: the server's cache belongs to the server.

A server that cannot be reached (or a connection lost mid-reply) raises `ServerUnreachable`;
`probe(url)` asks a server which model it serves with a short timeout, from any thread (the
window's link watch: app/core/server_link.py).
"""

from __future__ import annotations

import base64
import http.client
import json
import urllib.parse
from typing import Any, Generator, Optional

from engine.documents.extract import Document
from engine.documents.placement import place
from engine.engine import ModelInfo
from engine.errors import EngineError, RequestError, ServerUnreachable
from engine.generate.loop import drain
from engine.types import (
    CacheReport,
    CancelToken,
    Comparison,
    ContextInfo,
    Event,
    GenerationRequest,
    GenerationResult,
    PrefillProgress,
    RestoreEvent,
    TokenEvent,
)

DEFAULT_TIMEOUT_S = 600.0  # one read: a long prefill on a big model sends nothing for a while
PROBE_TIMEOUT_S = 3.0  # a health check: a server that answers nothing in this long counts as gone


class RemoteEngine:
    """A Verbatim server as an engine (see the module notes for what differs)."""

    def __init__(self, url: str, api_key: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        parsed = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise EngineError(f"not a server address: {url!r} (e.g. http://127.0.0.1:8765)")
        self.scheme, self.host = parsed.scheme, parsed.hostname
        self.port = parsed.port or (443 if parsed.scheme == "https" else 80)
        self.api_key, self.timeout = api_key, timeout
        self.info: Optional[ModelInfo] = None
        self.world_size = 1
        self.environment: dict[str, str] = {}  # the server's (a receipt's `environment`)

    # -- the model -------------------------------------------------------------------------
    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def context_limit(self) -> Optional[int]:
        return self.info.context_length if self.info is not None else None

    def load(self, spec: str = "", progress: Any = None, cancel: Optional[CancelToken] = None) -> ModelInfo:
        """Connect: the server's model (an error if `spec` names another one)."""
        m = self._json("GET", "/verbatim/model")
        if spec and spec != m["id"]:
            raise EngineError(f"the server at {self.address} serves {m['id']!r}, not {spec!r}")
        self.world_size = int(m.get("world_size") or 1)
        self.chunk: Optional[int] = int(m["chunk"]) if m.get("chunk") else None  # the server's prefill chunk
        self.environment = {str(k): str(v) for k, v in (m.get("environment") or {}).items()}
        self.info = ModelInfo(name=m["id"], path=f"{self.scheme}://{self.address}", key=m.get("key") or "",
                              model_type="remote", layers=0, cache_classes=[], kv_bits=None, dequantized=False,
                              load_s=0.0, context_length=m.get("context_length"))
        return self.info

    @property
    def placement(self) -> str:
        """Where the model runs: '3 ranks at 127.0.0.1:8765' (or '1 process at …')."""
        ranks = f"{self.world_size} ranks" if self.world_size > 1 else "1 process"
        return f"{ranks} at {self.address}"

    def describe(self) -> str:
        """The model and where it runs, for a status bar: 'demo · 3 ranks at 127.0.0.1:8765'."""
        return f"{self.info.name if self.info is not None else '?'} · {self.placement}"

    # -- generation ------------------------------------------------------------------------
    def stream(self, request: GenerationRequest, cancel: Optional[CancelToken] = None
               ) -> Generator[Event, None, GenerationResult]:
        """Generate on the server: yields its RestoreEvent, PrefillProgress and TokenEvents as
        they arrive, returns the result."""
        chat = request.prompt is None
        conn = self._connect()
        try:
            try:
                conn.request("POST", "/v1/chat/completions" if chat else "/v1/completions",
                             json.dumps(_body(request, chat)), self._headers())
                resp = conn.getresponse()
            except OSError as e:
                raise ServerUnreachable(f"cannot reach the server at {self.address}: {e}") from e
            if resp.status != 200:
                raise _error(resp.status, resp.read())
            text, logprobs, ids = "", [], []
            final: Optional[dict[str, Any]] = None
            restore: Optional[RestoreEvent] = None
            prefilled = 0  # prompt tokens the server's cache holds so far
            for data in _events(resp, self.address):
                if "error" in data:
                    raise EngineError(f"the server failed: {data['error'].get('message', data['error'])}")
                if cancel is not None and cancel.cancelled:
                    break
                v = data.get("verbatim") or {}
                if "restore" in v:
                    restore = restore_from_verbatim(v["restore"])
                    prefilled = restore.report.restored
                    yield restore
                elif "prefill" in v:
                    prefilled = int(v["prefill"]["done"])
                    yield PrefillProgress(prefilled, int(v["prefill"]["total"]))
                if not data.get("choices"):
                    continue
                choice = data["choices"][0]
                delta = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                lps = _entry_logprobs(choice.get("logprobs"), chat)
                if "finish_reason" in v:  # the last chunk: the report, with every id
                    final = v
                    named = [int(t) for t in v["token_ids"][len(ids):len(ids) + len(lps)]]
                else:
                    named = [int(t) for t in v.get("token_ids") or []]
                for i, lp in enumerate(lps):
                    logprobs.append(lp)
                    ids.append(named[i] if i < len(named) else -1)
                    yield TokenEvent(len(logprobs) - 1, ids[-1], lp, (delta or "") if i == 0 else "")
                if delta and not lps:  # text held back (a possible stop string) released later
                    yield TokenEvent(max(len(logprobs) - 1, 0), ids[-1] if ids else -1,
                                     logprobs[-1] if logprobs else 0.0, delta)
                text += delta or ""
            if final is None:  # stopped, or the stream ended early: what arrived, with its ids
                known = all(t >= 0 for t in ids)
                return GenerationResult(text, ids if known else [], logprobs if known else [], "cancelled",
                                        request.sampler.seed, [], stopped_report(request, restore, prefilled,
                                                                                 bool(logprobs)))
            return GenerationResult(text, list(final["token_ids"]), logprobs, final["finish_reason"],
                                    int(final["seed"]), [], report_from_verbatim(final))
        finally:
            conn.close()  # mid-stream: the server sees the client leave and stops the generation

    def generate(self, request: GenerationRequest, on_event: Any = None,
                 cancel: Optional[CancelToken] = None) -> GenerationResult:
        return drain(self.stream(request, cancel), on_event)

    def cold_run(self, request: GenerationRequest, cancel: Optional[CancelToken] = None) -> GenerationResult:
        """The request with no cache on the server (`"verbatim": {"cache": false}`)."""
        from dataclasses import replace

        return drain(self.stream(replace(request, use_cache=False), cancel))

    def verify(self, request: GenerationRequest, result: GenerationResult,
               cancel: Optional[CancelToken] = None) -> Comparison:
        cold = self.cold_run(request, cancel)
        return Comparison.of(result.tokens, result.logprobs, cold.tokens, cold.logprobs)

    # -- the tokenizer (on the server) -------------------------------------------------------
    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        return list(self._json("POST", "/verbatim/tokenize", {"messages": messages})["ids"])

    def token_texts(self, tokens: list[int]) -> list[str]:
        return list(self._json("POST", "/verbatim/tokenize", {"tokens": tokens})["texts"])

    def document_tokens(self, documents: tuple[Document, ...], system_prompt: str = "") -> list[int]:
        """Each document's cost, counted on the server (its tokenizer and template)."""
        body = {"documents": _file_parts(documents), "system": system_prompt}
        return [int(n) for n in self._json("POST", "/verbatim/tokenize", body)["document_tokens"]]

    def keep_documents(self, digests: Any) -> None:
        """Nothing to do: the server's cache is its own, and it keeps every document's state ahead
        (its clients' conversations are not known to it)."""

    def preload_documents(self, every_namespace: bool = False) -> int:
        """Nothing to do: a server preloads its own at start (`engine serve`)."""
        return 0

    def measure(self, request: GenerationRequest) -> ContextInfo:
        """The whole prompt of a chat request in tokens (the server's tokenizer and template) and
        the limit in force: the request's own, never past the served model's context."""
        if request.prompt is not None:
            raise EngineError("a remote engine counts chat messages only, not raw text")
        limit = self.context_limit
        if request.context_length:
            limit = min(limit, request.context_length) if limit else request.context_length
        # Documents counted where the server places them (placement is the same pure function).
        return ContextInfo(limit, len(self.prompt_ids(place(request.messages, request.documents))))

    # -- the cache -------------------------------------------------------------------------
    def cache_stats(self) -> dict[str, Any]:
        status = self._json("GET", "/verbatim/status")
        return {"remote": f"{self.scheme}://{self.address}", "world_size": self.world_size, **status}

    def clear_cache(self) -> None:
        raise EngineError(f"the prompt cache of the server at {self.address} is managed on that server")

    def memory_report(self) -> None:
        """None: the memory that matters is the server's, in its own process."""
        return None

    def set_memory_budget(self, budget_bytes: int) -> None:
        raise EngineError(f"the prompt cache of the server at {self.address} is managed on that server")

    def close(self) -> None:
        pass

    # -- HTTP -------------------------------------------------------------------------------
    def _connect(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout)

    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def _json(self, method: str, path: str, body: Optional[dict[str, Any]] = None) -> Any:
        conn = self._connect()
        try:
            conn.request(method, path, json.dumps(body) if body is not None else None, self._headers())
            resp = conn.getresponse()
            raw = resp.read()
        except OSError as e:
            raise ServerUnreachable(f"cannot reach the server at {self.address}: {e}") from e
        finally:
            conn.close()
        if resp.status != 200:
            raise _error(resp.status, raw)
        try:
            return json.loads(raw)
        except ValueError:
            raise EngineError(f"{self.address} answered, but not as a Verbatim server does") from None


def is_server_address(spec: str) -> bool:
    """Whether a model spec names a Verbatim server (http:// or https://) rather than a model."""
    return spec.startswith(("http://", "https://"))


def connect(url: str, api_key: Optional[str] = None) -> RemoteEngine:
    """A RemoteEngine already connected to the server at `url` (its model known): what an
    `EngineExecutor.swap` builds on the engine thread."""
    engine = RemoteEngine(url, api_key)
    engine.load()
    return engine


def probe(url: str, api_key: Optional[str] = None, timeout: float = PROBE_TIMEOUT_S) -> str:
    """The key of the model the server at `url` serves; `ServerUnreachable` if it does not answer
    within `timeout` seconds, `EngineError` if it refuses."""
    return str(RemoteEngine(url, api_key, timeout)._json("GET", "/verbatim/model").get("key") or "")


def _body(request: GenerationRequest, chat: bool) -> dict[str, Any]:
    s = request.sampler
    body: dict[str, Any] = {
        "model": "", "stream": True, "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k,
        "min_p": s.min_p, "repetition_penalty": s.repetition_penalty, "seed": s.seed, "max_tokens": s.max_tokens,
        "verbatim": {"mode": request.mode, "cache": request.use_cache, "token_ids": True, "progress": True},
    }
    if request.stop:
        body["stop"] = list(request.stop)
    if s.logit_bias:
        body["logit_bias"] = {str(token): bias for token, bias in s.logit_bias}
    c = request.continuation
    messages = request.messages
    if c is not None:  # our Continue: the reply's ids so far (or its text, as the last message)
        body["verbatim"]["continue"] = list(c.tokens) if c.tokens else True
        if not c.tokens and chat:
            messages = [*messages, {"role": "assistant", "content": c.text or ""}]
    if chat:
        body.update(messages=_with_files(messages, request.documents), logprobs=True)
        if request.constraint is not None:  # tools and response_format (engine/constraint.py)
            body.update(request.constraint.request_fields())
        if request.top_logprobs:
            body["top_logprobs"] = request.top_logprobs
    else:
        body.update(prompt=request.prompt, logprobs=request.top_logprobs)
    return body


def _with_files(messages: list[dict[str, Any]], documents: Any) -> list[dict[str, Any]]:
    """The documents as `file` parts of the first message (the server places them where this
    engine would: engine/serve/files.py), their extracted text sent as text/plain, so the model
    reads on the server exactly the text it would read here."""
    if not documents:
        return messages
    parts = _file_parts(documents)
    first, *rest = messages
    text = first.get("content") or ""
    return [{**first, "content": ([{"type": "text", "text": text}] if text else []) + parts}, *rest]


def _file_parts(documents: Any) -> list[dict[str, Any]]:
    """The documents as `file` parts, their extracted text sent as text/plain."""
    return [{"type": "file", "file": {"filename": d.name, "file_data": "data:text/plain;base64,"
                                      + base64.b64encode(d.text.encode()).decode("ascii")}} for d in documents]


def _events(resp: http.client.HTTPResponse, address: str) -> Generator[dict[str, Any], None, None]:
    """The JSON objects of a server-sent event stream, until [DONE] or the end."""
    try:
        for line in resp:
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                return
            yield json.loads(line[6:])
    except (OSError, http.client.HTTPException) as e:
        raise ServerUnreachable(f"the connection to the server at {address} was lost: {e}") from e


def _entry_logprobs(obj: Optional[dict[str, Any]], chat: bool) -> list[float]:
    if not obj:
        return []
    if chat:
        return [float(e["logprob"]) for e in obj.get("content") or []]
    return [float(lp) for lp in obj.get("token_logprobs") or []]


def _error(status: int, raw: bytes) -> EngineError:
    try:
        message = json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = raw[:200].decode(errors="replace")
    if status == 401:  # the server's hint is for HTTP clients ("send 'Authorization: …'"), not this one's users
        message = message.split(" (send ")[0]
    return (RequestError if status == 400 else EngineError)(f"the server refused the request ({status}): {message}")


def report_from_verbatim(v: dict[str, Any]) -> CacheReport:
    """A CacheReport from a response's `verbatim` object (rank 0's figures, and `ranks`)."""
    return CacheReport.from_dict({**v, "identical": v.get("identical_to_previous")})


def restore_from_verbatim(v: dict[str, Any]) -> RestoreEvent:
    """The server's RestoreEvent from a `verbatim.progress` stream's `restore` object."""
    return RestoreEvent(report_from_verbatim(v), [[int(a), int(b)] for a, b in v.get("planned") or []])


def stopped_report(request: GenerationRequest, restore: Optional[RestoreEvent], prefilled: int,
                   decoded: bool) -> CacheReport:
    """What a run stopped on the client's side did, as far as the stream told it: the server's
    report at the restore, the forwards up to `prefilled` prompt tokens (all of them, the last
    prompt token's included, once a token was `decoded`), and the seed the request used."""
    if restore is None:
        return CacheReport(seed=request.sampler.seed, sampler=request.sampler.to_dict(), mode=request.mode)
    r = restore.report_at(prefilled, decoded)
    r.seed = request.sampler.seed
    return r
