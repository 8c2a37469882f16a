"""Connections the server holds: timeouts for slow senders, a cap, the oldest half-open dropped.

aiohttp bounds header sizes but not how long a client may take to send them, and it holds a
partly sent request forever: a few thousand such "half-open" connections exhaust the process's
file descriptors and nothing else is served. So every connection goes through `Connection` (a
protocol in front of aiohttp's own), which a once-a-tick watchdog checks:

- a request not fully received within `request_timeout` of its first byte is aborted (headers
  and body alike: the app marks a request received once its body is read, see app.py);
- a connection with no request in progress is closed after `idle_timeout` (keep-alive, or a
  client that connects and sends nothing);
- at most `max_connections` are open: one more drops the oldest half-open connection (a request
  started and not finished), else the oldest idle one; busy ones (a request being answered) are
  never dropped. So a normal request is served within seconds, however many slow ones are held.

`GuardedSite` is aiohttp's TCPSite with these connections; `raise_fd_limit` lifts the process's
soft RLIMIT_NOFILE toward its hard limit so the cap, not the OS, is what refuses.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from aiohttp import web

from engine.serve.guard import RateLimitedLog

REQUEST_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 15.0
MAX_CONNECTIONS = 512
FD_RESERVE = 256  # descriptors kept for everything else (model files, the disk cache, logs)
MIN_CONNECTIONS = 16


@dataclass(frozen=True)
class Limits:
    request_timeout: float = REQUEST_TIMEOUT_S  # from a request's first byte to its last
    idle_timeout: float = IDLE_TIMEOUT_S  # no request in progress
    max_connections: int = MAX_CONNECTIONS

    def __post_init__(self) -> None:
        if self.request_timeout <= 0 or self.idle_timeout <= 0 or self.max_connections < 1:
            raise ValueError("connection limits must be positive")


IDLE, RECEIVING, HANDLING = "idle", "receiving", "handling"


class Connection(asyncio.Protocol):
    """One client connection: aiohttp's protocol (`inner`) behind it, its phase for the watchdog."""

    def __init__(self, guard: "ConnectionGuard", inner: asyncio.Protocol) -> None:
        self.guard, self.inner = guard, inner
        self.transport: Optional[asyncio.Transport] = None
        self.phase = IDLE
        self.since = guard.clock()  # when the current phase began
        self.early = False  # bytes of a next request came while this one was answered

    # -- asyncio.Protocol, delegated ------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.guard._opened(self)
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if data:
            if self.phase == IDLE:
                self.phase, self.since = RECEIVING, self.guard.clock()
            elif self.phase == HANDLING:
                self.early = True
        self.inner.data_received(data)

    def eof_received(self) -> Optional[bool]:
        return self.inner.eof_received()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.guard._closed(self)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    # -- phases, set by the app ----------------------------------------------------------------
    def received(self) -> None:
        """The request is all in (headers, and the body once read): no deadline while answered."""
        self.phase, self.since = HANDLING, self.guard.clock()

    def answered(self) -> None:
        """The response is sent: idle again until the next request's first byte (or receiving
        already, if bytes of the next one came meanwhile: pipelining)."""
        self.phase, self.since = (RECEIVING if self.early else IDLE), self.guard.clock()
        self.early = False

    def drop(self) -> None:
        """Abort now, and stop counting it now: connection_lost only comes on a later loop turn,
        and a burst of accepts must not pick the same victim again."""
        self.guard.open.pop(self, None)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()


class ConnectionGuard:
    """Every open `Connection`, in opening order, and the watchdog that enforces `Limits`."""

    def __init__(self, limits: Limits, log: RateLimitedLog, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits, self.log, self.clock = limits, log, clock
        self.open: dict[Connection, None] = {}  # insertion-ordered: oldest first
        self._by_transport: dict[Any, Connection] = {}
        self.timed_out = 0  # requests not received in time
        self.evicted = 0  # dropped for a newer connection
        self.idle_closed = 0
        self._tick: Optional[asyncio.TimerHandle] = None

    def factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], Connection]:
        return lambda: Connection(self, inner())

    def of(self, request: web.BaseRequest) -> Optional[Connection]:
        return self._by_transport.get(request.transport)

    def stats(self) -> dict[str, int]:
        return {"open": len(self.open), "limit": self.limits.max_connections, "timed_out": self.timed_out,
                "evicted": self.evicted, "idle_closed": self.idle_closed}

    # -- bookkeeping ---------------------------------------------------------------------------
    def _opened(self, conn: Connection) -> None:
        self.open[conn] = None
        self._by_transport[conn.transport] = conn
        if len(self.open) > self.limits.max_connections:
            victim = self._victim(conn)
            self.evicted += 1
            self.log("evicted", f"local server: more than {self.limits.max_connections} connections open; "
                                "dropping the oldest half-open or idle one")
            victim.drop()

    def _victim(self, newest: Connection) -> Connection:
        idle = None
        for c in self.open:  # oldest first
            if c is newest:
                continue
            if c.phase == RECEIVING:
                return c
            if idle is None and c.phase == IDLE:
                idle = c
        return idle if idle is not None else newest  # all busy: the newcomer waits for none

    def _closed(self, conn: Connection) -> None:
        self.open.pop(conn, None)
        self._by_transport.pop(conn.transport, None)

    # -- the watchdog --------------------------------------------------------------------------
    def start(self) -> None:
        self._schedule()

    def stop(self) -> None:
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None

    def _schedule(self) -> None:
        period = min(1.0, self.limits.request_timeout / 4, self.limits.idle_timeout / 4)
        self._tick = asyncio.get_running_loop().call_later(period, self._check)

    def _check(self) -> None:
        now = self.clock()
        slow, idle = [], []
        for c in self.open:
            if c.phase == RECEIVING and now - c.since > self.limits.request_timeout:
                slow.append(c)
            elif c.phase == IDLE and now - c.since > self.limits.idle_timeout:
                idle.append(c)
        if slow:
            self.timed_out += len(slow)
            self.log("slow", f"local server: closed {len(slow)} connection(s) whose request was not fully "
                             f"received within {self.limits.request_timeout:g} s")
        self.idle_closed += len(idle)
        for c in slow:
            c.drop()
        for c in idle:
            self.open.pop(c, None)
            if c.transport is not None:
                c.transport.close()
        self._schedule()


class GuardedSite(web.TCPSite):
    """aiohttp's TCPSite, every connection wrapped by `guard`."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard,
                 backlog: int = 1024, **kw: Any) -> None:
        super().__init__(runner, host, port, backlog=backlog, **kw)
        self.guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with the runner
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self.guard.factory(server), self._host, self._port,
                                                backlog=self._backlog, reuse_address=self._reuse_address,
                                                reuse_port=self._reuse_port)
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port


def raise_fd_limit(wanted: int) -> int:
    """Lift the soft RLIMIT_NOFILE to `wanted` (at most the hard limit); the soft limit after."""
    try:
        import resource
    except ImportError:  # Windows: no such limit to raise
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return wanted if soft == resource.RLIM_INFINITY else soft


def connection_cap(wanted: int) -> int:
    """`wanted` connections, fewer if the descriptor limit (raised as far as allowed) is lower."""
    soft = raise_fd_limit(wanted + FD_RESERVE)
    return max(MIN_CONNECTIONS, min(wanted, soft - FD_RESERVE))
