"""Routes a remote engine needs beyond the OpenAI API (engine/remote.py uses them):

    GET  /verbatim/model      the served model's identity: id, model key, context, world size, and
                              the environment its arithmetic depends on (a receipt's, receipts.py)
    POST /verbatim/tokenize   {"messages": [...]} -> {"ids": [...]}  (the chat template applied)
                              {"tokens": [...]}   -> {"texts": [...]} (the text each token adds)

The tokenizer runs on the engine thread like everything else, through `engine_call` (on rank 0
only in a distributed run: it needs no other rank).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from engine.bridge import engine_call
from engine.errors import VerbatimError
from engine.receipts import environment
from engine.serve.schema import APIError

MAX_TOKENS_TO_NAME = 1 << 16


def add_engine_routes(app: web.Application, config_key: Any, executor_key: Any) -> None:
    env: dict[str, str] = {}  # the server's environment: the same for every request, read once

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
        try:
            body = await request.json()
        except ValueError as e:
            raise APIError(400, f"the request body is not valid JSON: {e}", code="invalid_json")
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object")
        executor = request.app[executor_key]
        tokens = body.get("tokens")
        try:
            if tokens is not None:
                if (not isinstance(tokens, list) or len(tokens) > MAX_TOKENS_TO_NAME
                        or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens)):
                    raise APIError(400, "'tokens' must be a list of token ids", param="tokens")
                texts = await engine_call(executor, lambda eng: eng.token_texts(tokens))
                return web.json_response({"texts": texts})
            messages = body.get("messages")
            ids = await engine_call(executor, lambda eng: eng.prompt_ids(messages))
            return web.json_response({"ids": ids})
        except VerbatimError as e:
            raise APIError(400, str(e))

    app.router.add_get("/verbatim/model", model)
    app.router.add_post("/verbatim/tokenize", tokenize)
