"""Running the app: on the current asyncio loop (the GUI's qasync loop, or the CLI's own).

`ServerHandle.start()` binds and returns the URL; `stop()` cancels every generation in flight
(each ends with its partial result, the cache kept consistent), closes the connections, unbinds.
`serve(...)` is the CLI's whole life: load, serve until SIGINT/SIGTERM, shut down cleanly.

Connections go through a `ConnectionGuard` (timeouts, a cap: connections.py), requests through
the header checks (guard.py, keys.py); aiohttp's and asyncio's own logs are rate-limited while
a server runs, so a flood of bad connections cannot fill the log.
"""

from __future__ import annotations

import asyncio
import ipaddress
import signal
import sys
from dataclasses import replace
from typing import Any, Callable, Iterable, Optional, Sequence

from aiohttp import web

from engine.serve import DEFAULT_HOST, DEFAULT_PORT, DEFAULT_QUEUE_LIMIT
from engine.serve.admission import ServerState
from engine.serve.app import CONFIG_KEY, create_app, log_once
from engine.serve.connections import (
    ConnectionGuard,
    GuardedSite,
    Limits,
    connection_cap,
)
from engine.serve.guard import BrowserGuard, install_log_filter
from engine.serve.keys import Keys
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


def check_bind(host: str, api_keys: Optional[Sequence[str]] | str) -> None:
    """Loopback by default; any other address is reachable by others, so it needs a key."""
    keys = [api_keys] if isinstance(api_keys, str) else list(api_keys or [])
    if not is_loopback(host) and not any(keys):
        raise ServeError(f"binding to {host} makes the server reachable from other machines: "
                         "give an --api-key or --api-keys-file (clients send it as 'Authorization: Bearer <key>')")


class ServerHandle:
    """One running server on the current loop.

    `api_key` / `api_keys`: the keys accepted (each its own cache namespace; none: no key needed
    and every client shares the API namespace). `share_window_cache`: keyless clients use the app
    window's own namespace instead (the window's "Share this window's cache" toggle).
    `allow_origins`: web origins whose pages may call the server (CORS). `limits`: connection timeouts
    and cap. `mode`: the cache mode of requests that do not name one.
    """

    def __init__(self, executor: Any, model: Optional[ServedModel], host: str = DEFAULT_HOST,
                 port: int = DEFAULT_PORT, api_key: Optional[str] = None,
                 queue_limit: int = DEFAULT_QUEUE_LIMIT, *, api_keys: Iterable[str] | str = (),
                 share_window_cache: bool = False, allow_origins: Iterable[str] = (),
                 limits: Limits = Limits(), mode: str = "exact", **app_options: Any) -> None:
        extra = [api_keys] if isinstance(api_keys, str) else list(api_keys)  # one key, not its characters
        keys = Keys.of([*([api_key] if api_key else []), *extra], share_window_cache)
        check_bind(host, keys.keys)
        self.host, self.port = host, port
        self.state = ServerState(queue_limit)
        self.limits = limits
        try:
            self.browser = BrowserGuard(host, port, tuple(allow_origins))
        except ValueError as e:
            raise ServeError(f"--allow-origin: {e}") from e
        self.connections: Optional[ConnectionGuard] = None
        self.app = create_app(executor, model, keys=keys, state=self.state, browser=self.browser, mode=mode,
                              **app_options)
        self._runner: Optional[web.AppRunner] = None
        self._unfilter: Optional[Callable[[], None]] = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    @property
    def running(self) -> bool:
        return self._runner is not None

    @property
    def share_window_cache(self) -> bool:
        return self.app[CONFIG_KEY].keys.share_window

    def set_share_window_cache(self, on: bool) -> None:
        """Keyless API clients use the window's cache namespace (on) or their own (off), from now on."""
        config = self.app[CONFIG_KEY]
        config.keys = replace(config.keys, share_window=on)

    def set_model(self, model: Optional[ServedModel]) -> None:
        """Serve another model from now on (the window loaded one); None: answer 503."""
        self.app[CONFIG_KEY].model = model

    async def start(self) -> str:
        limits = replace(self.limits, max_connections=connection_cap(self.limits.max_connections))
        guard = ConnectionGuard(limits, log_once)
        runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None,
                               shutdown_timeout=SHUTDOWN_TIMEOUT_S,
                               # aiohttp's own idle timer only as a backstop: the guard closes first
                               keepalive_timeout=2 * limits.idle_timeout + 1,
                               lingering_time=min(2.0, limits.request_timeout))
        await runner.setup()
        site = GuardedSite(runner, self.host, self.port, guard)
        try:
            await site.start()
        except OSError as e:
            await runner.cleanup()
            raise ServeError(f"cannot listen on {self.host}:{self.port}: {e.strerror or e}") from e
        if self.port == 0:
            self.port = site.port
        self.browser.port = self.port
        self.connections = self.app[CONFIG_KEY].connections = guard
        guard.start()
        self._unfilter = install_log_filter()
        self._runner = runner
        self.app[CONFIG_KEY].extra_status["url"] = self.url
        return self.url

    async def stop(self) -> None:
        """Cancel what runs, close connections, unbind. Idempotent."""
        runner, self._runner = self._runner, None
        self.state.cancel_all()
        if self.connections is not None:
            self.connections.stop()
        if runner is not None:
            await runner.cleanup()
        if self._unfilter is not None:
            self._unfilter()
            self._unfilter = None


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


def serve(executor: Any, model: ServedModel, host: str, port: int, api_keys: Sequence[str] | str = (),
          queue_limit: int = DEFAULT_QUEUE_LIMIT, **options: Any) -> None:
    """The CLI's server: blocks until a signal; the caller closes the executor afterwards."""
    handle = ServerHandle(executor, model, host, port, None, queue_limit, api_keys=api_keys, **options)

    def announce(url: str) -> None:
        print(f"Verbatim server: {model.id} at {url} (Ctrl-C to stop)", file=sys.stderr, flush=True)

    asyncio.run(serve_until_stopped(handle, announce))
    print("Verbatim server: stopped", file=sys.stderr, flush=True)
