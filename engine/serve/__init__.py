"""A local HTTP server on the engine's exact prompt cache: OpenAI's chat completions and
Responses APIs and Anthropic's Messages API, three wire formats over one generation path.

Built on aiohttp, so it runs on any asyncio loop: its own under `python -m engine serve`, the
app's qasync loop under the GUI's "Local server" toggle. Every generation goes through the
engine bridge (engine/bridge.py) onto the engine executor's one thread, like the GUI's own work.

Modules: formats/ (one module per wire format: parse its body into the engine's request, render
the reply in its shapes; none imports another), generation.py (the one path they share:
admission, the run through the bridge, errors, streaming), reply.py (the reply read into events
as it is decoded: text deltas, tool calls), report.py (the `verbatim` object, the prompt's cache
split, token logprobs), schema.py (field readers every format shares; `APIError`), tools.py
(OpenAI's tool fields into a `Constraint`), files.py (`file` content parts read as documents),
quote.py (what errors may echo of the input; the fields a message may carry), admission.py (the
bounded request queue and each request's hooks on the engine thread), tokens.py (token names for
logprobs), app.py (routes), server.py (run and stop on a loop), guard.py (Host, Origin and
Content-Type checks; rate-limited logs), keys.py (API keys and the prompt-cache namespace of
each request), connections.py (timeouts and a cap on connections), engine_routes.py (what a
remote engine asks of the server). This package itself imports nothing: the GUI and the command
line read the defaults from here before aiohttp, MLX or the engine is needed.
"""

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
DEFAULT_QUEUE_LIMIT = 32  # requests waiting or running at most; one more gets 429
MAX_BODY = 8 << 20  # bytes: larger request bodies get 413 (`engine serve --max-body-mb`)
