"""Running the app: on the current asyncio loop (the GUI's qasync loop, or the CLI's own).

`ServerHandle.start()` binds and returns the URL; `stop()` cancels every generation in flight
(each keeps the cache consistent, see bridge.py), closes the connections and unbinds.
`serve(...)` is the CLI's whole life: load, serve until SIGINT/SIGTERM, shut down cleanly.
"""

from __future__ import annotations

import asyncio
import ipaddress
import signal
import sys
from typing import Any, Callable, Optional

from aiohttp import web

from engine.serve.app import CONFIG_KEY, create_app
from engine.serve.bridge import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    DEFAULT_QUEUE_LIMIT,
    ServerState,
)
from engine.serve.schema import ServedModel

SHUTDOWN_TIMEOUT_S = 5.0


class ServeError(Exception):
    """A server that cannot start as asked (an address in use, no API key off loopback)."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: Optional[str]) -> None:
    """Loopback by default; any other address is reachable by others, so it needs a key."""
    if not is_loopback(host) and not api_key:
        raise ServeError(f"binding to {host} makes the server reachable from other machines: "
                         "give an --api-key (clients send it as 'Authorization: Bearer <key>')")


class ServerHandle:
    """One running server on the current loop."""

    def __init__(self, executor: Any, model: Optional[ServedModel], host: str = DEFAULT_HOST,
                 port: int = DEFAULT_PORT, api_key: Optional[str] = None,
                 queue_limit: int = DEFAULT_QUEUE_LIMIT, **app_options: Any) -> None:
        check_bind(host, api_key)
        self.host, self.port = host, port
        self.state = ServerState(queue_limit)
        self.app = create_app(executor, model, api_key=api_key, state=self.state, **app_options)
        self._runner: Optional[web.AppRunner] = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    @property
    def running(self) -> bool:
        return self._runner is not None

    def set_model(self, model: Optional[ServedModel]) -> None:
        """Serve another model from now on (the window loaded one); None: answer 503."""
        self.app[CONFIG_KEY].model = model

    async def start(self) -> str:
        runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None,
                               shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except OSError as e:
            await runner.cleanup()
            raise ServeError(f"cannot listen on {self.host}:{self.port}: {e.strerror or e}") from e
        server = getattr(site, "_server", None)
        if self.port == 0 and server is not None and server.sockets:
            self.port = server.sockets[0].getsockname()[1]
        self._runner = runner
        self.app[CONFIG_KEY].extra_status["url"] = self.url
        return self.url

    async def stop(self) -> None:
        """Cancel what runs, close connections, unbind. Idempotent."""
        runner, self._runner = self._runner, None
        self.state.cancel_all()
        if runner is not None:
            await runner.cleanup()


async def serve_until_stopped(handle: ServerHandle, announce: Callable[[str], None],
                              stop: Optional[asyncio.Event] = None) -> None:
    """Serve until SIGINT/SIGTERM (or `stop` is set), then shut down cleanly."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
        except (NotImplementedError, RuntimeError):  # not the main thread, or Windows
            pass
    try:
        url = await handle.start()
        announce(url)
        await stop.wait()
    finally:
        await handle.stop()
        for sig in installed:
            loop.remove_signal_handler(sig)


def serve(executor: Any, model: ServedModel, host: str, port: int, api_key: Optional[str],
          queue_limit: int = DEFAULT_QUEUE_LIMIT) -> None:
    """The CLI's server: blocks until a signal; the caller closes the executor afterwards."""
    handle = ServerHandle(executor, model, host, port, api_key, queue_limit)

    def announce(url: str) -> None:
        print(f"Verbatim server: {model.id} at {url} (Ctrl-C to stop)", file=sys.stderr, flush=True)

    asyncio.run(serve_until_stopped(handle, announce))
    print("Verbatim server: stopped", file=sys.stderr, flush=True)
