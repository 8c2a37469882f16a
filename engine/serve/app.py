"""The aiohttp application: OpenAI-compatible routes over the engine executor.

`create_app(executor, model)` builds it; `ServerHandle` (server.py) runs it on whatever asyncio
loop is current, the CLI's own or the GUI's qasync loop. Routes:

    GET  /v1/models             the loaded model
    GET  /v1/models/{id}        the same, by name
    POST /v1/chat/completions   chat (stream with server-sent events, logprobs, top_logprobs)
    POST /v1/completions        raw text continuation (no chat template)
    POST /v1/responses          OpenAI's Responses API (GET / DELETE /v1/responses/{id}: a stored one)
    POST /v1/messages           Anthropic's Messages API (any query string: `?beta=true`)
    POST /v1/messages/count_tokens
    GET  /verbatim/status       the model, the request queue and the connections

Each reply carries a `verbatim` object with the prompt-cache report and the seed used. Errors
are OpenAI error objects, or Anthropic's envelope on /v1/messages (formats/messages.py).

Each wire format (engine/serve/formats/) parses its body into the engine's request; the one
generation path (generation.py) runs it: a `Ticket` in the bounded queue (admission.py), the
engine bridge, a stream's headers once the first event came.

Before any work, from the headers alone (the body is not read yet): the Host, Origin and
Content-Type checks (guard.py), then the API key, which also picks the request's prompt-cache
namespace (keys.py). A request refused there is answered and its connection closed.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable, Optional, Sequence

from aiohttp import web

from engine.errors import RequestError
from engine.serve import DEFAULT_QUEUE_LIMIT, MAX_BODY, files
from engine.serve.admission import ServerState
from engine.serve.connections import ConnectionGuard
from engine.serve.engine_routes import add_engine_routes
from engine.serve.formats import chat, messages, responses
from engine.serve.generation import Generation, Outcome, StreamWriter, log_once, run_admitted, stream
from engine.serve.guard import BrowserGuard
from engine.serve.keys import Keys
from engine.serve.quote import quote
from engine.serve.schema import APIError, Defaults, ServedModel, bad, receipt_wanted
from engine.types import GenerationRequest

RETRY_AFTER_S = 2  # seconds, sent with 429 (queue full) and 503 (stopping, no model)

STATE_KEY = web.AppKey("verbatim_state", ServerState)
CONFIG_KEY: "web.AppKey[ServeConfig]" = web.AppKey("verbatim_config")
EXECUTOR_KEY: "web.AppKey[Any]" = web.AppKey("verbatim_executor")
RESPONSES_KEY = web.AppKey("verbatim_responses", responses.ResponseStore)  # previous_response_id, GET
# Per request: its prompt-cache namespace (keys.py), and an allowed Origin to answer with CORS headers.
NAMESPACE_KEY: "web.RequestKey[Optional[str]]" = web.RequestKey("verbatim_namespace", object)
ORIGIN_KEY: "web.RequestKey[str]" = web.RequestKey("verbatim_origin", str)


@dataclass
class ServeConfig:
    model: Optional[ServedModel]
    keys: Keys = field(default_factory=Keys)
    max_body: int = MAX_BODY
    extra_status: dict[str, Any] = field(default_factory=dict)  # e.g. the URL
    browser: Optional[BrowserGuard] = None  # None: no Host/Origin checks (an app not served by ServerHandle)
    connections: Optional[ConnectionGuard] = None
    mode: str = "exact"  # for requests that do not ask for one
    seed: Optional[int] = None  # for requests that name none (`serve --seed`); None: a fresh one each


def error_response(e: APIError, request: Optional[web.Request] = None) -> web.Response:
    """The error in the envelope of the request's wire format (Anthropic's on /v1/messages)."""
    headers = {"Retry-After": str(RETRY_AFTER_S)} if e.status in (429, 503) else None
    anthropic = request is not None and request.path.startswith("/v1/messages")
    return web.json_response(messages.error_body(e) if anthropic else e.body(), status=e.status, headers=headers)


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
            resp = error_response(e, request)
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
        return error_response(e, request)
    except web.HTTPRequestEntityTooLarge:
        resp = error_response(_too_large(config.max_body), request)
        resp.force_close()  # the rest of the body is not worth reading
        return resp
    except web.HTTPException as e:
        if e.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status)
        return error_response(APIError(e.status, e.reason or "error", code=code), request)
    except RecursionError:  # a deeply nested body that got past json.loads
        return error_response(APIError(400, "the request body is nested too deeply", code="invalid_json"), request)
    except Exception as e:  # a bug: still an error object, and the log says it once a minute
        log_once(f"bug:{type(e).__name__}", "local server: unexpected error", logging.ERROR, e)
        return error_response(APIError(500, f"internal error: {type(e).__name__}", "server_error"), request)


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


def served(request: web.Request, name: str) -> ServedModel:
    """The model being served, if `name` names it (or is empty)."""
    model = request.app[CONFIG_KEY].model
    if model is None:
        raise APIError(503, "no model is loaded", "server_error", code="no_model")
    if not model.matches(name):
        raise APIError(404, f"the model {quote(name)} does not exist; this server serves {model.id!r}",
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


def _defaults(request: web.Request) -> Defaults:
    config = request.app[CONFIG_KEY]
    return Defaults(config.mode, config.seed, config.model.template_reads if config.model is not None else ())


async def chat_completions(request: web.Request) -> web.StreamResponse:
    body = await _read_json(request)
    return await _chat(request, chat.parse_chat(body, _defaults(request)), body)


async def completions(request: web.Request) -> web.StreamResponse:
    body = await _read_json(request)
    return await _chat(request, chat.parse_completion(body, _defaults(request)), body)


async def _generate(request: web.Request, asked: str, gen: GenerationRequest, api: str, body: Any, streamed: bool,
                    writer: Callable[[str], StreamWriter], final: Callable[[str, Outcome], Any], *,
                    logprobs: bool = False, prompt_param: str = "messages",
                    documents: Sequence[files.FileBytes] = ()) -> web.StreamResponse:
    """Run a parsed request of any wire format: admitted now (or refused: 429 when the queue is
    full, 503 while the server stops), in the requester's own cache namespace (keys.py: it
    restores and stores only there), answered by the format's `writer` (a stream) or `final` (the
    body), each given the model's name as the client wrote it. `api` and `body`: the request as
    sent, for its receipt (`verbatim.receipt`). `documents`: the files its parts carry, read
    here off the event loop (files.read_all, within the server's limits) before it is admitted:
    a file that cannot be a document is a 400 naming its part."""
    model = served(request, asked)
    name = asked or model.id
    if documents:
        try:
            gen = replace(gen, documents=await files.read_all(documents))
        except RequestError as e:
            raise bad(str(e), e.param) from None
    async with Generation(request.app[EXECUTOR_KEY], request.app[STATE_KEY], model,
                          replace(gen, cache_namespace=request.get(NAMESPACE_KEY)), logprobs=logprobs,
                          per_token=streamed, prompt_param=prompt_param,
                          wire=(api, body) if receipt_wanted(body) else None) as run:
        if streamed:
            return await stream(request, run, writer(name))
        return web.json_response(final(name, await run.final()))


async def _chat(request: web.Request, parsed: chat.ParsedRequest, body: Any) -> web.StreamResponse:
    return await _generate(request, parsed.model, parsed.request,
                           "chat.completions" if parsed.kind == "chat" else "completions", body, parsed.stream,
                           lambda name: chat.ChatStream(parsed, name),
                           lambda name, outcome: chat.full_response(parsed, name, outcome),
                           logprobs=parsed.logprobs, prompt_param=parsed.prompt_param, documents=parsed.files)


async def create_response(request: web.Request) -> web.StreamResponse:
    body = await _read_json(request)
    parsed = responses.parse(body, _defaults(request))
    store, namespace = request.app[RESPONSES_KEY], request.get(NAMESPACE_KEY)
    previous = store.get(namespace, parsed.previous) if parsed.previous else None
    parsed = responses.resolve(parsed, previous)

    def final(name: str, outcome: Outcome) -> Any:
        obj = responses.final(parsed, name, outcome)
        if parsed.store:
            store.put(namespace, obj, responses.conversation(parsed, outcome), parsed.files)
        return obj

    return await _generate(request, parsed.model, parsed.request, "responses", body, parsed.stream,
                           lambda name: responses.ResponseStream(parsed, name, store, namespace), final,
                           documents=parsed.files)


async def get_response(request: web.Request) -> web.Response:
    stored = request.app[RESPONSES_KEY].get(request.get(NAMESPACE_KEY), request.match_info["id"], "response_id")
    return web.json_response(stored.response)


async def delete_response(request: web.Request) -> web.Response:
    ident = request.match_info["id"]
    request.app[RESPONSES_KEY].delete(request.get(NAMESPACE_KEY), ident)
    return web.json_response({"id": ident, "object": "response", "deleted": True})


async def create_message(request: web.Request) -> web.StreamResponse:
    body = await _read_json(request)
    parsed = messages.parse(body, _defaults(request))
    return await _generate(request, parsed.model, parsed.request, "messages", body, parsed.stream,
                           lambda name: messages.MessageStream(parsed, name),
                           lambda name, outcome: messages.final(parsed, name, outcome))


async def count_tokens(request: web.Request) -> web.Response:
    """The prompt's tokens (the chat template applied, tools rendered), nothing generated."""
    body = await _read_json(request)
    name, gen = messages.parse_count(body, _defaults(request))
    model = served(request, name)
    info = await run_admitted(request.app[EXECUTOR_KEY], request.app[STATE_KEY], model,
                              lambda engine: engine.measure(gen))
    return web.json_response({"input_tokens": info.prompt_tokens})


async def not_found(request: web.Request) -> web.StreamResponse:
    raise APIError(404, f"no route {quote(request.method)} {quote(request.path)}", code="not_found")


def create_app(executor: Any, model: Optional[ServedModel], *, keys: Optional[Keys] = None,
               max_body: int = MAX_BODY, queue_limit: int = DEFAULT_QUEUE_LIMIT,
               state: Optional[ServerState] = None, browser: Optional[BrowserGuard] = None,
               connections: Optional[ConnectionGuard] = None, mode: str = "exact",
               seed: Optional[int] = None) -> web.Application:
    """The server's application. `executor.submit(fn)` must run `fn(engine)` on the engine thread."""
    app = web.Application(middlewares=[_guarded], client_max_size=max_body)
    app[EXECUTOR_KEY] = executor
    app[STATE_KEY] = state if state is not None else ServerState(queue_limit)
    app[RESPONSES_KEY] = responses.ResponseStore()
    app[CONFIG_KEY] = ServeConfig(model, keys or Keys(), max_body, browser=browser, connections=connections,
                                  mode=mode, seed=seed)
    app.on_response_prepare.append(_cors)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{id:.+}", one_model)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/responses", create_response)
    app.router.add_get("/v1/responses/{id}", get_response)
    app.router.add_delete("/v1/responses/{id}", delete_response)
    app.router.add_post("/v1/messages", create_message)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
    app.router.add_get("/verbatim/status", status)
    add_engine_routes(app, CONFIG_KEY, EXECUTOR_KEY, STATE_KEY, _read_json)  # what engine/remote.py needs (engine_routes.py)
    return app
