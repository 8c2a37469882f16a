"""Routes a remote engine needs beyond the OpenAI API (engine/remote.py uses them):

    GET  /verbatim/model      the served model's identity: id, model key, context, world size, and
                              the environment its arithmetic depends on (a receipt's, receipts.py)
    POST /verbatim/tokenize   {"messages": [...]} -> {"ids": [...]}  (the chat template applied)
                              {"tokens": [...]}   -> {"texts": [...]} (the text each token adds)
                              {"documents": [file parts], "system": "..."}
                                  -> {"document_tokens": [...]} (what each costs: Engine.document_tokens)

The tokenizer runs on the engine thread like everything else, through the executor (on rank 0
only in a distributed run: it needs no other rank), and a tokenize request is admitted as a
generation is (a `Ticket` in the bounded queue: 429 when full, 503 while stopping, counted in
/verbatim/status): it waits its turn behind generations, never beside them, and the slow-request
timer stops once its body is in (`read_json`), however long the engine is busy. Token ids are
checked against the tokenizer's vocabulary (a 400 naming `tokens`, never a 500).
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from aiohttp import web

from engine.errors import RequestError
from engine.receipts import environment
from engine.serve.files import file_part, read_all
from engine.serve.generation import run_admitted
from engine.serve.quote import clip
from engine.serve.schema import APIError

MAX_TOKENS_TO_NAME = 1 << 16
MAX_TOKEN_ID = (1 << 31) - 1  # beyond any vocabulary; checked before the engine sees it


def vocabulary_size(tokenizer: Any) -> int:
    """Token ids the tokenizer can name (its base vocabulary and added tokens)."""
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    try:
        return len(inner)
    except TypeError:
        return int(getattr(inner, "vocab_size"))


def add_engine_routes(app: web.Application, config_key: Any, executor_key: Any, state_key: Any,
                      read_json: Callable[[web.Request], Awaitable[Any]]) -> None:
    env: dict[str, str] = {}  # the server's environment: the same for every request, read once

    async def admitted(request: web.Request, fn: Callable[[Any], Any]) -> Any:
        return await run_admitted(request.app[executor_key], request.app[state_key], request.app[config_key].model, fn)

    async def model(request: web.Request) -> web.Response:
        config = request.app[config_key]
        served = config.model
        if served is None:
            raise APIError(503, "no model is loaded", "server_error", code="no_model")
        if not env:
            env.update(environment())
        return web.json_response({"id": served.id, "key": served.key, "context_length": served.context_length,
                                  "chunk": served.chunk,
                                  "world_size": int(config.extra_status.get("world_size", 1)),
                                  "environment": env})

    async def tokenize(request: web.Request) -> web.Response:
        body = await read_json(request)  # the request is all in: no deadline from here on
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object")
        tokens = body.get("tokens")
        if tokens is not None:
            if (not isinstance(tokens, list) or len(tokens) > MAX_TOKENS_TO_NAME
                    or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TOKEN_ID
                               for t in tokens)):
                raise APIError(400, f"'tokens' must be a list of at most {MAX_TOKENS_TO_NAME} token ids",
                               param="tokens")

            def texts(engine: Any) -> list[str]:
                size = vocabulary_size(engine.lm.tokenizer)
                out_of_range = next((t for t in tokens if t >= size), None)
                if out_of_range is not None:
                    raise APIError(400, f"'tokens' holds {out_of_range}, past the vocabulary ({size} tokens)",
                                   param="tokens")
                return engine.token_texts(tokens)

            return web.json_response({"texts": await admitted(request, texts)})
        if body.get("documents") is not None:
            docs, system = await documents_of(body), body.get("system") or ""
            if not isinstance(system, str):
                raise APIError(400, "'system' must be a string", param="system")
            costs = await admitted(request, lambda eng: eng.document_tokens(docs, system))
            return web.json_response({"document_tokens": costs})
        messages = body.get("messages")
        return web.json_response({"ids": await admitted(request, lambda eng: eng.prompt_ids(messages))})

    async def documents_of(body: dict[str, Any]) -> tuple[Any, ...]:
        """The `documents` of a tokenize request: `file` parts, as a chat message carries them,
        read off the event loop as a chat request's are."""
        parts = body["documents"]
        if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
            raise APIError(400, "'documents' must be a list of file parts", param="documents")
        try:
            return await read_all([file_part(p, f"documents[{i}]") for i, p in enumerate(parts)])
        except RequestError as e:
            raise APIError(400, clip(str(e)), param=e.param) from None

    app.router.add_get("/verbatim/model", model)
    app.router.add_post("/verbatim/tokenize", tokenize)
