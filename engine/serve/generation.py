"""The one generation path every wire format shares (issue 47).

A wire format (engine/serve/formats/) parses its body into the engine's `GenerationRequest` and
renders a reply in its own shapes; everything between is here, the same for chat completions,
Responses and Messages:

- admission: a `Ticket` in the bounded queue (admission.py: 429 when full, 503 while stopping);
- the run through the engine bridge (engine/bridge.py, `engine_batches`) on the engine thread,
  as the window generates; closing it (the client left and aiohttp cancelled the handler, or
  anything failed) cancels the generation, which keeps only exact snapshots;
- the engine's errors as `APIError`s (each format writes them in its own envelope);
- the reply read into events while it is decoded (reply.py: text deltas, tool calls);
- a stream's headers wait for the first event, so an error found before prefill (context too
  long, a bad template) is still answered with its status code rather than inside a 200 stream;
  then each batch of events (at most ~20 a second) is one write.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Protocol, TypeVar

from aiohttp import web

from engine.bridge import Done, StreamEvent, engine_batches
from engine.errors import ContextLengthError, EngineError, RequestError, VerbatimError
from engine.generate.constraints import ConstraintFailed
from engine.serve.admission import ModelChanged, ServerState, Ticket, Withdrawn
from engine.serve.guard import RateLimitedLog
from engine.serve.quote import clip
from engine.serve.reply import Reply, ReplyEvent, ReplyReader, request_key
from engine.serve.report import TokenLogprob, no_paths
from engine.serve.schema import APIError, ServedModel
from engine.types import GenerationRequest, GenerationResult, TokenEvent

T = TypeVar("T")
log = logging.getLogger(__name__)
log_once = RateLimitedLog(log)  # one line per cause per minute
Batches = AsyncGenerator[list[StreamEvent], None]  # engine_batches: one list per wake-up of the loop
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def cancelled() -> APIError:
    return APIError(503, "the generation was cancelled: the server is stopping", "server_error", code="cancelled")


def engine_error(e: BaseException, prompt_param: str = "messages") -> APIError:
    """An exception from the engine thread as an API error (`prompt_param`: the field a
    context-length error names)."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, ContextLengthError):
        return APIError(400, str(e), param=prompt_param, code="context_length_exceeded")
    if isinstance(e, ConstraintFailed):  # while decoding: a 400 (clients do not retry it), short
        return APIError(400, clip(str(e)), param=e.param, code="constraint_failed")
    if isinstance(e, RequestError):
        param = getattr(e, "param", None) or ("logit_bias" if str(e).startswith("logit_bias") else None)
        return APIError(400, clip(str(e)), param=param)
    if isinstance(e, ModelChanged):
        return APIError(409, str(e), code="model_changed")
    if isinstance(e, Withdrawn):  # cancelled while it waited, its client still here: the server stops
        return cancelled()
    if isinstance(e, EngineError):
        return APIError(503, no_paths(str(e)), "server_error", code="engine_unavailable")
    log_once(f"generation:{type(e).__name__}", "local server: generation failed", logging.ERROR, e)
    return APIError(500, f"generation failed: {type(e).__name__}: {no_paths(str(e))}", "server_error")


async def run_admitted(executor: Any, state: ServerState, served: Optional[ServedModel],
                       fn: Callable[[Any], T]) -> T:
    """`fn(engine)` on the engine thread in its turn, as an admitted request (a Ticket: 429 when
    the queue is full, 503 while stopping): what is not a generation (tokenize, count tokens)
    waits its turn behind generations, never beside them."""
    if served is None:
        raise APIError(503, "no model is loaded", "server_error", code="no_model")
    ticket = Ticket(state, served.key, False)

    def job(engine: Any) -> T:
        try:
            ticket.start(engine)  # withdrawn (client gone, server stopping), or the model changed
            return fn(engine)
        finally:
            ticket.finished()

    fut = executor.submit(job)
    try:
        return await asyncio.wrap_future(fut)
    except ModelChanged as e:
        raise APIError(409, str(e), code="model_changed") from None
    except Withdrawn:
        raise APIError(503, "the request was cancelled: the server is stopping", "server_error",
                       code="cancelled") from None
    except VerbatimError as e:
        raise APIError(400, clip(str(e))) from None
    finally:
        if fut.done():
            ticket.finished()  # a job that never ran (the executor failed it) frees its place too
        else:
            ticket.cancel.cancel()  # the client left: the job, when its turn comes, does nothing


def sse(obj: Any, event: Optional[str] = None) -> bytes:
    """One server-sent event: `data: <json>` (after `event: <name>` when named)."""
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


@dataclass
class Outcome:
    """A finished generation: the engine's result, the reply read from it, the logprob entries
    (when asked), the request's place in the queue, the stop string that ended it, and the reply
    events its end settled (all of them for a reply that was not streamed)."""

    result: GenerationResult
    reply: Reply
    entries: Optional[list[TokenLogprob]]
    queue: dict[str, Any]
    stop_string: Optional[str] = None
    events: list[ReplyEvent] = field(default_factory=list)
    receipt: Optional[dict[str, Any]] = None  # when the request asked for one


class Generation:
    """One admitted request's generation. Admitted when made (or APIError 429/503); use as
    `async with`: leaving the block closes the bridge, which cancels a generation still running."""

    def __init__(self, executor: Any, state: ServerState, model: ServedModel, request: GenerationRequest, *,
                 logprobs: bool = False, per_token: bool = False, prompt_param: str = "messages",
                 wire: Optional[tuple[str, Any]] = None) -> None:
        self.request = request
        self.model = model
        self.wire = wire  # (the API, the body as sent): the reply carries a receipt recording them
        self.prompt_param = prompt_param
        self.key = request_key(request)  # what the reply's ids derive from (reply.py)
        self.reader = ReplyReader(model.tool_parser, request.constraint, self.key)
        # Admitted last: nothing after it may fail before the bridge's hooks free its place.
        self.ticket = Ticket(state, model.key, logprobs, per_token=per_token, stops=request.stop)
        # Iterated at once (that submits the job); the ticket's hooks run on the engine thread.
        self._batches: Batches = engine_batches(executor, request, self.ticket.cancel, start=self.ticket.start,
                                                observe=self.ticket.observe)

    async def __aenter__(self) -> "Generation":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._batches.aclose()

    async def next(self) -> list[StreamEvent]:
        """The next batch of events; the engine's error (or the ticket's) as an APIError."""
        try:
            return await anext(self._batches)
        except StopAsyncIteration:
            raise RuntimeError("the engine bridge ended without its final event") from None  # it never does
        except Exception as e:
            raise engine_error(e, self.prompt_param) from None

    def feed(self, event: TokenEvent) -> list[ReplyEvent]:
        """The reply events a decoded token settles."""
        return self.reader.feed(event.text)

    def feed_all(self, events: list[StreamEvent]) -> list[ReplyEvent]:
        """The reply events a batch's decoded tokens settle (a format that does not write per token)."""
        return [e for event in events if isinstance(event, TokenEvent) for e in self.feed(event)]

    def outcome(self, done: Done) -> tuple[list[ReplyEvent], Outcome]:
        """The last reply events and the outcome; APIError 503 when the server cancelled it."""
        result = done.result
        if result.finish_reason == "cancelled":
            raise cancelled()
        events, reply = self.reader.finish(result.text, result.finish_reason)
        receipt = self._receipt(result) if self.wire is not None else None
        return events, Outcome(result, reply, self.ticket.entries, self.ticket.queue_info(), self.ticket.stop_string,
                               events, receipt)

    def _receipt(self, result: GenerationResult) -> Optional[dict[str, Any]]:
        """The reply's receipt (engine/receipts.py), recording the request as sent besides the
        engine's request it became. The model's spec is its id here (never a path): `engine
        verify --model` points a replay at the model's folder."""
        from engine.receipts import ReceiptError, ReceiptModel, build

        assert self.wire is not None
        m = self.model
        try:
            r = build(self.request, result, ReceiptModel(m.id, m.key or "", m.id), result.report.chunk_size)
        except ReceiptError:  # a reply without tokens: nothing to replay
            return None
        return replace(r, wire={"api": self.wire[0], "request": self.wire[1]}).to_dict()

    async def final(self) -> Outcome:
        """Run to the end (a non-streamed reply)."""
        while True:
            batch = await self.next()
            if isinstance(batch[-1], Done):
                return self.outcome(batch[-1])[1]


class StreamWriter(Protocol):
    """A wire format's stream: the bytes for each part (engine/serve/formats/)."""

    def start(self, gen: Generation) -> bytes: ...

    def batch(self, gen: Generation, events: list[StreamEvent]) -> bytes: ...

    def end(self, gen: Generation, last: list[ReplyEvent], outcome: Outcome) -> bytes: ...

    def error(self, e: APIError) -> bytes: ...


async def stream(request: web.Request, gen: Generation, writer: StreamWriter) -> web.StreamResponse:
    """Answer with a stream of server-sent events: headers once the first event came."""
    batch = await gen.next()  # an error here is answered with its status code
    resp = web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    out = writer.start(gen)
    while True:
        done = batch[-1] if isinstance(batch[-1], Done) else None
        out += writer.batch(gen, [e for e in batch if not isinstance(e, Done)])
        if done is not None:
            break
        if out:
            await resp.write(out)
            out = b""
        try:
            batch = await gen.next()
        except APIError as e:  # after the headers: the error goes inside the stream
            await resp.write(out + writer.error(e))
            return resp
    try:
        last, outcome = gen.outcome(done)
    except APIError as e:  # the server is stopping (a client that left reads nothing)
        await resp.write(out + writer.error(e))
        return resp
    await resp.write(out + writer.end(gen, last, outcome))
    await resp.write_eof()
    return resp
