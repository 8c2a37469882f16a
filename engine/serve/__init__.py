"""A local OpenAI-compatible HTTP server on the engine's exact prompt cache.

Built on aiohttp, so it runs on any asyncio loop: its own under `python -m engine serve`, the
app's qasync loop under the GUI's "Local server" toggle. Every generation goes through the
engine executor's one thread, like the GUI's own work (see bridge.py).

Modules: schema.py (request validation, response shaping; no aiohttp), bridge.py (the bounded
queue and one job on the engine thread), app.py (routes), server.py (run and stop on a loop),
guard.py (Host, Origin and Content-Type checks; rate-limited logs), keys.py (API keys and the
prompt-cache namespace of each request), connections.py (timeouts and a cap on connections).
"""
