"""The aiohttp application: OpenAI-compatible routes over the engine executor.

`create_app(executor, model)` builds it; `ServerHandle` (server.py) runs it on whatever asyncio
loop is current, the CLI's own or the GUI's qasync loop. Routes:

    GET  /v1/models             the loaded model
    GET  /v1/models/{id}        the same, by name
    POST /v1/chat/completions   chat (stream with server-sent events, logprobs, top_logprobs)
    POST /v1/completions        raw text continuation (no chat template)
    GET  /verbatim/status       the model, the request queue and the connections

Each response carries a `verbatim` object with the prompt-cache report and the seed used.

Generations go through the engine bridge (engine/bridge.py, `engine_batches`), as the window's
do, each with its `Ticket` in the bounded queue (admission.py). A stream's headers wait for the
first event; then each batch of events (at most ~20 a second) is one write, one chunk per token.

Before any work, from the headers alone (the body is not read yet): the Host, Origin and
Content-Type checks (guard.py), then the API key, which also picks the request's prompt-cache
namespace (keys.py). A request refused there is answered and its connection closed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable, Optional

from aiohttp import web

from engine.bridge import Done, StreamEvent, engine_batches
from engine.errors import ContextLengthError, EngineError, RequestError
from engine.generate.constraints import ConstraintFailed
from engine.serve import DEFAULT_QUEUE_LIMIT, MAX_BODY, responses, schema, tools
from engine.serve.admission import ModelChanged, ServerState, Ticket, Withdrawn
from engine.serve.connections import ConnectionGuard
from engine.serve.guard import BrowserGuard, RateLimitedLog
from engine.serve.keys import Keys
from engine.serve.engine_routes import add_engine_routes
from engine.serve.quote import clip, quote
from engine.serve.schema import APIError, ServedModel
from engine.types import PrefillProgress, RestoreEvent, TokenEvent

log = logging.getLogger(__name__)
Batches = AsyncGenerator[list[StreamEvent], None]  # engine_batches: one list per wake-up of the loop

RETRY_AFTER_S = 2  # seconds, sent with 429 (queue full) and 503 (stopping, no model)

STATE_KEY = web.AppKey("verbatim_state", ServerState)
CONFIG_KEY: "web.AppKey[ServeConfig]" = web.AppKey("verbatim_config")
EXECUTOR_KEY: "web.AppKey[Any]" = web.AppKey("verbatim_executor")
# Per request: its prompt-cache namespace (keys.py), and an allowed Origin to answer with CORS headers.
NAMESPACE_KEY: "web.RequestKey[Optional[str]]" = web.RequestKey("verbatim_namespace", object)
ORIGIN_KEY: "web.RequestKey[str]" = web.RequestKey("verbatim_origin", str)

log_once = RateLimitedLog(log)  # one line per cause per minute


@dataclass
class ServeConfig:
    model: Optional[ServedModel]
    keys: Keys = field(default_factory=Keys)
    max_body: int = MAX_BODY
    extra_status: dict[str, Any] = field(default_factory=dict)  # e.g. the URL
    browser: Optional[BrowserGuard] = None  # None: no Host/Origin checks (an app not served by ServerHandle)
    connections: Optional[ConnectionGuard] = None
    mode: str = "exact"  # for requests that do not ask for one


def error_response(e: APIError) -> web.Response:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if e.status in (429, 503) else None
    return web.json_response(e.body(), status=e.status, headers=headers)


def _cancelled() -> APIError:
    return APIError(503, "the generation was cancelled: the server is stopping", "server_error", code="cancelled")


def _engine_error(e: BaseException, kind: str = "chat") -> APIError:
    """An exception from the engine thread as an API error."""
    if isinstance(e, ContextLengthError):
        return APIError(400, str(e), param="messages" if kind == "chat" else "prompt",
                        code="context_length_exceeded")
    if isinstance(e, ConstraintFailed):  # while decoding: a 400 (clients do not retry it), short
        return APIError(400, clip(str(e)), param=e.param, code="constraint_failed")
    if isinstance(e, RequestError):
        param = getattr(e, "param", None) or ("logit_bias" if str(e).startswith("logit_bias") else None)
        return APIError(400, clip(str(e)), param=param)
    if isinstance(e, ModelChanged):
        return APIError(409, str(e), code="model_changed")
    if isinstance(e, Withdrawn):  # cancelled while it waited, its client still here: the server stops
        return _cancelled()
    if isinstance(e, EngineError):
        return APIError(503, responses.no_paths(str(e)), "server_error", code="engine_unavailable")
    log_once(f"generation:{type(e).__name__}", "local server: generation failed", logging.ERROR, e)
    return APIError(500, f"generation failed: {type(e).__name__}: {responses.no_paths(str(e))}", "server_error")


@web.middleware
async def _guarded(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                   ) -> web.StreamResponse:
    """The header checks, then the handler; every error as an OpenAI error object."""
    config = request.app[CONFIG_KEY]
    conn = config.connections.of(request) if config.connections is not None else None
    try:
        try:
            origin = (config.browser.check(request.method, request.headers, _local_ip(request))
                      if config.browser else None)
            if origin is not None:
                request[ORIGIN_KEY] = origin
            if request.method == "OPTIONS":
                return _preflight(request, origin)
            request[NAMESPACE_KEY] = config.keys.namespace(request.headers)
        except APIError as e:  # refused from the headers: the body is never read
            resp = error_response(e)
            resp.force_close()
            return resp
        if conn is not None and request.method != "POST":
            conn.received()  # no body to wait for
        return await _answer(request, handler, config)
    finally:
        if conn is not None:
            conn.answered()


def _local_ip(request: web.Request) -> Optional[str]:
    """The address this connection arrived on (this machine's own)."""
    sock = request.transport.get_extra_info("sockname") if request.transport is not None else None
    return str(sock[0]) if isinstance(sock, tuple) and sock else None


async def _answer(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                  config: ServeConfig) -> web.StreamResponse:
    try:
        return await handler(request)
    except APIError as e:
        return error_response(e)
    except web.HTTPRequestEntityTooLarge:
        resp = error_response(_too_large(config.max_body))
        resp.force_close()  # the rest of the body is not worth reading
        return resp
    except web.HTTPException as e:
        if e.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status)
        return error_response(APIError(e.status, e.reason or "error", code=code))
    except RecursionError:  # a deeply nested body that got past json.loads
        return error_response(APIError(400, "the request body is nested too deeply", code="invalid_json"))
    except Exception as e:  # a bug: still an OpenAI error object, and the log says it once a minute
        log_once(f"bug:{type(e).__name__}", "local server: unexpected error", logging.ERROR, e)
        return error_response(APIError(500, f"internal error: {type(e).__name__}", "server_error"))


def _preflight(request: web.Request, origin: Optional[str]) -> web.StreamResponse:
    """A CORS preflight: answered only for an allowed origin (the others got 403 already)."""
    if origin is None:
        raise APIError(405, "OPTIONS is answered only as a CORS preflight (with an Origin)",
                       code="method_not_allowed")
    return web.Response(status=204, headers=BrowserGuard.preflight_headers(origin))


async def _cors(request: web.Request, response: web.StreamResponse) -> None:
    """Before any response's headers go out: CORS headers for an allowed origin."""
    origin = request.get(ORIGIN_KEY)
    if origin is not None and "Access-Control-Allow-Origin" not in response.headers:
        response.headers.update(BrowserGuard.cors_headers(origin))


def _too_large(limit: int) -> APIError:
    return APIError(413, f"the request body is larger than {limit} bytes", code="request_too_large")


async def _read_json(request: web.Request) -> Any:
    limit = request.app[CONFIG_KEY].max_body
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(limit)
    raw = await request.read()  # aiohttp refuses bodies past client_max_size (413) as it reads
    conns = request.app[CONFIG_KEY].connections
    conn = conns.of(request) if conns is not None else None
    if conn is not None:
        conn.received()  # all in: the request-read deadline no longer applies
    try:
        return json.loads(raw)
    except RecursionError:
        raise APIError(400, "the request body is nested too deeply", code="invalid_json") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None


def _served(request: web.Request, parsed: schema.ParsedRequest) -> ServedModel:
    model = request.app[CONFIG_KEY].model
    if model is None:
        raise APIError(503, "no model is loaded", "server_error", code="no_model")
    if not model.matches(parsed.model):
        raise APIError(404, f"the model {quote(parsed.model)} does not exist; this server serves {model.id!r}",
                       param="model", code="model_not_found")
    return model


def _model_object(model: ServedModel) -> dict[str, Any]:
    return {"id": model.id, "object": "model", "created": 0, "owned_by": "verbatim",
            "context_length": model.context_length, "aliases": list(model.public_aliases)}


async def models(request: web.Request) -> web.Response:
    model = request.app[CONFIG_KEY].model
    return web.json_response({"object": "list", "data": [_model_object(model)] if model is not None else []})


async def one_model(request: web.Request) -> web.Response:
    """Only the listed names (the id and the aliases /v1/models shows): a file system path that
    a request may use as the model's name is not answered here, so whether a path exists (a
    user name, a model folder) cannot be probed: every other name gets the same 404."""
    served = request.app[CONFIG_KEY].model
    name = request.match_info["id"]
    if served is None or not name or (name != served.id and name not in served.public_aliases):
        raise APIError(404, f"the model {quote(name)} does not exist", param="model", code="model_not_found")
    return web.json_response(_model_object(served))


async def status(request: web.Request) -> web.Response:
    config = request.app[CONFIG_KEY]
    model = config.model
    out: dict[str, Any] = {
        "model": model.id if model is not None else None,
        "queue": request.app[STATE_KEY].status(),
        **config.extra_status,
    }
    if config.connections is not None:
        out["connections"] = config.connections.stats()
    return web.json_response(out)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    body = await _read_json(request)
    return await _generate(request, schema.parse_chat(body, mode=request.app[CONFIG_KEY].mode))


async def completions(request: web.Request) -> web.StreamResponse:
    body = await _read_json(request)
    return await _generate(request, schema.parse_completion(body, mode=request.app[CONFIG_KEY].mode))


async def _generate(request: web.Request, parsed: schema.ParsedRequest) -> web.StreamResponse:
    model = _served(request, parsed)
    name = parsed.model or model.id
    # The requester's own cache namespace (keys.py): it restores and stores only there.
    gen = replace(parsed.request, cache_namespace=request.get(NAMESPACE_KEY))
    # Admitted now (or refused: 429 when the queue is full, 503 while the server stops).
    ticket = Ticket(request.app[STATE_KEY], model.key, parsed.logprobs, per_token=parsed.stream)
    # Through the engine bridge, as the window generates: the ticket's hooks run on the engine
    # thread. Iterated at once (that submits the job). Closing the batches (the client left and
    # aiohttp cancelled the handler, or anything failed) cancels the generation; a cancelled
    # generation keeps only exact snapshots, so the cache stays consistent.
    batches = engine_batches(request.app[EXECUTOR_KEY], gen, ticket.cancel, start=ticket.start,
                             observe=ticket.observe)
    async with aclosing(batches):
        if parsed.stream:
            return await _stream(request, parsed, name, ticket, batches)
        try:
            done = await _final(batches)
        except Exception as e:  # the engine's error (or the ticket's: model changed, withdrawn)
            raise _engine_error(e, parsed.kind) from None
        if done.result.finish_reason == "cancelled":
            raise _cancelled()
        body = responses.full_response(parsed, name, done.result, ticket.entries, ticket.queue_info())
        reader = tools.reader_for(model.tool_parser, parsed.request.constraint)
        if reader is not None:  # the reply's tool calls, read with the model's mlx-lm parser
            tools.shape_message(body["choices"][0], reader.read(done.result), done.result.finish_reason)
        return web.json_response(body)


async def _final(batches: Batches) -> Done:
    async for batch in batches:
        if isinstance(batch[-1], Done):
            return batch[-1]
    raise RuntimeError("the engine bridge ended without its final event")  # it never does: Done or raise


def _sse(chunks: list[Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n" for obj in chunks)


async def _stream(request: web.Request, parsed: schema.ParsedRequest, name: str, ticket: Ticket,
                  batches: Batches) -> web.StreamResponse:
    # Headers wait for the first event: an error found before prefill (context too long, bad
    # template) is still answered with its status code rather than inside a 200 stream.
    try:
        batch = await anext(batches)
    except Exception as e:
        raise _engine_error(e, parsed.kind) from None
    reader = tools.reader_for(request.app[CONFIG_KEY].model.tool_parser if request.app[CONFIG_KEY].model else None,
                              parsed.request.constraint)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                       "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    # With tools the reply may be only calls: the role chunk then carries no content, so a client
    # that assembles the stream reads content null, as in the non-streamed reply.
    out: list[Any] = ([responses.chunk(parsed, name, None if reader is not None else "", None, role=True)]
                      if parsed.kind == "chat" else [])
    text = ""  # everything the engine has decoded so far
    sent = 0  # characters of it already sent (the engine holds back what may start a stop string)
    seen = 0  # tokens whose logprobs were sent
    named = 0  # tokens whose ids were sent (verbatim.token_ids)
    while True:
        done: Optional[Done] = None
        for event in batch:  # one chunk per token, one write per batch
            if isinstance(event, TokenEvent):
                text += event.text
                entries = None
                if parsed.logprobs and event.index >= seen:
                    entry = ticket.entry(event.index)
                    if entry is not None:
                        entries, seen = [entry], event.index + 1
                ids = [event.token] if parsed.token_ids and event.index >= named else None
                # Tool calls are held back until the reply is whole (then sent as tool_calls deltas).
                delta = (reader.visible(text) if reader is not None else text)[sent:]
                if delta or entries or ids:
                    c = responses.chunk(parsed, name, delta, entries, text_offset=sent)
                    if ids:
                        c["verbatim"] = {"token_ids": ids}
                        named = event.index + 1
                    out.append(c)
                    sent += len(delta)
            elif isinstance(event, (RestoreEvent, PrefillProgress)) and parsed.progress:
                out.append(_progress_chunk(parsed, name, event))
            elif isinstance(event, Done):
                done = event
        if done is not None:
            break
        if out:
            await resp.write(_sse(out))
            out = []
        try:
            batch = await anext(batches)
        except Exception as e:  # after the headers: the error goes inside the stream
            await resp.write(_sse([*out, _engine_error(e, parsed.kind).body()]))  # clients raise it; no [DONE]
            return resp
    result = done.result
    if result.finish_reason == "cancelled":  # the server is stopping (a client that left reads nothing)
        await resp.write(_sse([*out, _cancelled().body()]))  # no [DONE]: the reply is not complete
        return resp
    reply = reader.read(result) if reader is not None else None
    content = reply.content or "" if reply is not None else result.text
    rest: Optional[str] = content[sent:] if content.startswith(text[:sent]) else ""
    if reply is not None and reply.calls and not rest:
        rest = None  # a tool-call reply ends without a content delta (content stays null, as non-streamed)
    entries = ticket.entries[seen:] if ticket.entries is not None else None
    finish = (tools.finish_reason(reply, result.finish_reason) if reply is not None else None) \
        or responses.finish_reason(result)
    if reply is not None and reply.calls:
        calls = responses.chunk(parsed, name, None, None)
        calls["choices"][0]["delta"]["tool_calls"] = tools.call_deltas(reply.calls)
        out.append(calls)
    last = responses.chunk(parsed, name, rest, entries if parsed.logprobs else None, finish=finish, text_offset=sent)
    last["system_fingerprint"] = responses.fingerprint(result.report.model_key)
    last["verbatim"] = responses.verbatim_report(result, ticket.queue_info())
    if parsed.include_usage:
        usage_chunk = responses.chunk(parsed, name, None, None)
        usage_chunk["choices"] = []
        usage_chunk["usage"] = responses.usage(result)
        out += [last, usage_chunk]
    else:
        last["usage"] = responses.usage(result)
        out.append(last)
    await resp.write(_sse(out) + b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def _progress_chunk(parsed: schema.ParsedRequest, name: str, event: "RestoreEvent | PrefillProgress") -> dict[str, Any]:
    """A chunk with no choices that tells the restore or the prefill's progress (`verbatim.progress`)."""
    c = responses.chunk(parsed, name, None, None)
    c["choices"] = []
    c["verbatim"] = responses.progress_fields(event)
    return c


async def not_found(request: web.Request) -> web.StreamResponse:
    raise APIError(404, f"no route {quote(request.method)} {quote(request.path)}", code="not_found")


def create_app(executor: Any, model: Optional[ServedModel], *, keys: Optional[Keys] = None,
               max_body: int = MAX_BODY, queue_limit: int = DEFAULT_QUEUE_LIMIT,
               state: Optional[ServerState] = None, browser: Optional[BrowserGuard] = None,
               connections: Optional[ConnectionGuard] = None, mode: str = "exact") -> web.Application:
    """The server's application. `executor.submit(fn)` must run `fn(engine)` on the engine thread."""
    app = web.Application(middlewares=[_guarded], client_max_size=max_body)
    app[EXECUTOR_KEY] = executor
    app[STATE_KEY] = state if state is not None else ServerState(queue_limit)
    app[CONFIG_KEY] = ServeConfig(model, keys or Keys(), max_body, browser=browser, connections=connections,
                                  mode=mode)
    app.on_response_prepare.append(_cors)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{id:.+}", one_model)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/verbatim/status", status)
    add_engine_routes(app, CONFIG_KEY, EXECUTOR_KEY, STATE_KEY, _read_json)  # what engine/remote.py needs (engine_routes.py)
    return app
