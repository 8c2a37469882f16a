"""The aiohttp application: OpenAI-compatible routes over the engine executor.

`create_app(executor, model)` builds it; `ServerHandle` (server.py) runs it on whatever asyncio
loop is current, the CLI's own or the GUI's qasync loop. Routes:

    GET  /v1/models             the loaded model
    POST /v1/chat/completions   chat (stream with server-sent events, logprobs, top_logprobs)
    POST /v1/completions        raw text continuation (no chat template)
    GET  /verbatim/status       the model and the request queue (waiting / running / limit)

Each response carries a `verbatim` object with the prompt-cache report and the seed used.
"""

from __future__ import annotations

import hmac
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional

from aiohttp import web

from engine.errors import ContextLengthError, EngineError, RequestError
from engine.serve import schema
from engine.serve.bridge import (
    DEFAULT_QUEUE_LIMIT,
    Done,
    Job,
    ModelChanged,
    ServerState,
    Tokens,
)
from engine.serve.engine_routes import add_engine_routes
from engine.serve.schema import APIError, ServedModel

log = logging.getLogger(__name__)

MAX_BODY = 8 << 20  # bytes: larger request bodies get 413

STATE_KEY = web.AppKey("verbatim_state", ServerState)
CONFIG_KEY: "web.AppKey[ServeConfig]" = web.AppKey("verbatim_config")
EXECUTOR_KEY: "web.AppKey[Any]" = web.AppKey("verbatim_executor")


@dataclass
class ServeConfig:
    model: Optional[ServedModel]
    api_key: Optional[str] = None
    max_body: int = MAX_BODY
    extra_status: dict[str, Any] = field(default_factory=dict)  # e.g. the URL


def error_response(e: APIError) -> web.Response:
    return web.json_response(e.body(), status=e.status)


def _cancelled() -> APIError:
    return APIError(503, "the generation was cancelled: the server is stopping", "server_error", code="cancelled")


def _engine_error(e: BaseException) -> APIError:
    """An exception from the engine thread as an API error."""
    if isinstance(e, ContextLengthError):
        return APIError(400, str(e), param="messages", code="context_length_exceeded")
    if isinstance(e, RequestError):
        return APIError(400, str(e))
    if isinstance(e, ModelChanged):
        return APIError(409, str(e), code="model_changed")
    if isinstance(e, EngineError):
        return APIError(503, str(e), "server_error", code="engine_unavailable")
    log.error("generation failed", exc_info=e)
    return APIError(500, f"generation failed: {type(e).__name__}: {e}", "server_error")


@web.middleware
async def _errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                  ) -> web.StreamResponse:
    """Every error as an OpenAI error object; the API key checked first when one is set."""
    config = request.app[CONFIG_KEY]
    try:
        if config.api_key is not None:
            _check_key(request, config.api_key)
        return await handler(request)
    except APIError as e:
        return error_response(e)
    except web.HTTPRequestEntityTooLarge:
        return error_response(_too_large(config.max_body))
    except web.HTTPException as e:
        if e.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status)
        return error_response(APIError(e.status, e.reason or "error", code=code))


def _check_key(request: web.Request, key: str) -> None:
    got = request.headers.get("Authorization", "")
    scheme, _, token = got.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise APIError(401, "missing or wrong API key (send 'Authorization: Bearer <key>')",
                       code="invalid_api_key")


def _too_large(limit: int) -> APIError:
    return APIError(413, f"the request body is larger than {limit} bytes", code="request_too_large")


async def _read_json(request: web.Request) -> Any:
    limit = request.app[CONFIG_KEY].max_body
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(limit)
    raw = await request.read()  # aiohttp refuses bodies past client_max_size (413) as it reads
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}", code="invalid_json")


def _served(request: web.Request, parsed: schema.ParsedRequest) -> ServedModel:
    model = request.app[CONFIG_KEY].model
    if model is None:
        raise APIError(503, "no model is loaded", "server_error", code="no_model")
    if not model.matches(parsed.model):
        raise APIError(404, f"the model {parsed.model!r} does not exist; this server serves {model.id!r}",
                       param="model", code="model_not_found")
    return model


async def models(request: web.Request) -> web.Response:
    model = request.app[CONFIG_KEY].model
    data = []
    if model is not None:
        data.append({"id": model.id, "object": "model", "created": 0, "owned_by": "verbatim",
                     "context_length": model.context_length, "aliases": list(model.aliases)})
    return web.json_response({"object": "list", "data": data})


async def status(request: web.Request) -> web.Response:
    config = request.app[CONFIG_KEY]
    model = config.model
    return web.json_response({
        "model": model.id if model is not None else None,
        "queue": request.app[STATE_KEY].status(),
        **config.extra_status,
    })


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, schema.parse_chat(await _read_json(request)))


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, schema.parse_completion(await _read_json(request)))


async def _generate(request: web.Request, parsed: schema.ParsedRequest) -> web.StreamResponse:
    model = _served(request, parsed)
    name = parsed.model or model.id
    job = Job(request.app[STATE_KEY], request.app[EXECUTOR_KEY], parsed.request, model.key,
              parsed.logprobs)
    try:
        if parsed.stream:
            return await _stream(request, parsed, name, job)
        while True:
            item = await job.items.get()
            if isinstance(item, Done):
                break
        if item.error is not None:
            raise _engine_error(item.error)
        assert item.result is not None
        if item.result.finish_reason == "cancelled":
            raise _cancelled()
        return web.json_response(schema.full_response(parsed, name, item.result, item.entries, job.queue_info()))
    finally:
        # The client left (aiohttp cancels the handler) or anything failed: stop the generation.
        # A cancelled generation keeps only exact snapshots, so the cache stays consistent.
        job.abandon()


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many characters at the end of `text` could be the start of a stop string."""
    keep = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), keep, -1):
            if text.endswith(s[:n]):
                keep = n
                break
    return keep


async def _stream(request: web.Request, parsed: schema.ParsedRequest, name: str, job: Job) -> web.StreamResponse:
    # Headers wait for the first event: an error found before prefill (context too long, bad
    # template) is still answered with its status code rather than inside a 200 stream.
    item = await job.items.get()
    if isinstance(item, Done):
        if item.error is not None:
            raise _engine_error(item.error)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                       "X-Accel-Buffering": "no"})
    await resp.prepare(request)

    async def send(obj: Any) -> None:
        await resp.write(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")

    chat = parsed.kind == "chat"
    if chat:
        await send(schema.chunk(parsed, name, "", None, role=True))
    text = ""  # everything the engine has decoded so far
    sent = 0  # characters of it already sent (the rest may be the start of a stop string)
    seen = 0  # tokens whose logprobs were sent
    while not isinstance(item, Done):
        if isinstance(item, Tokens):
            text += item.event.text
            entries = None
            if parsed.logprobs and item.event.index >= seen and item.entry is not None:
                entries = [item.entry]
                seen = item.event.index + 1
            upto = len(text) - _held_back(text, parsed.request.stop)
            delta = text[sent:upto] if upto > sent else ""
            if delta or entries:
                await send(schema.chunk(parsed, name, delta, entries, text_offset=sent))
                sent = max(sent, upto)
        item = await job.items.get()
    result = item.result
    if item.error is not None or result is None or result.finish_reason == "cancelled":
        err = _engine_error(item.error) if item.error is not None else _cancelled()
        await send(err.body())  # clients raise it; no [DONE]: the reply is not complete
        return resp
    final = result.text
    rest = final[sent:] if final.startswith(text[:sent]) else ""
    entries = item.entries[seen:] if item.entries is not None else None
    last = schema.chunk(parsed, name, rest, entries if parsed.logprobs else None,
                        finish=schema.finish_reason(result), text_offset=sent)
    last["system_fingerprint"] = schema.fingerprint(result.report.model_key)
    last["verbatim"] = schema.verbatim_report(result, job.queue_info())
    if parsed.include_usage:
        await send(last)
        usage_chunk = schema.chunk(parsed, name, None, None)
        usage_chunk["choices"] = []
        usage_chunk["usage"] = schema.usage(result)
        await send(usage_chunk)
    else:
        last["usage"] = schema.usage(result)
        await send(last)
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def not_found(request: web.Request) -> web.StreamResponse:
    raise APIError(404, f"no route {request.method} {request.path}", code="not_found")


def create_app(executor: Any, model: Optional[ServedModel], *, api_key: Optional[str] = None,
               max_body: int = MAX_BODY, queue_limit: int = DEFAULT_QUEUE_LIMIT,
               state: Optional[ServerState] = None) -> web.Application:
    """The server's application. `executor.submit(fn)` must run `fn(engine)` on the engine thread."""
    app = web.Application(middlewares=[_errors], client_max_size=max_body)
    app[EXECUTOR_KEY] = executor
    app[STATE_KEY] = state if state is not None else ServerState(queue_limit)
    app[CONFIG_KEY] = ServeConfig(model, api_key, max_body)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/verbatim/status", status)
    add_engine_routes(app, CONFIG_KEY, EXECUTOR_KEY)  # what engine/remote.py needs (engine_routes.py)
    return app
