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
  started and not finished), else the oldest idle one; busy ones (a request being answered), ones
  whose request is all in (`RequestScan`: the headers and Content-Length bytes of body seen, even
  before aiohttp got to it) and ones whose reply is being written are never dropped for it. A
  connection accepted but not read yet (a burst of accepts comes before any read) is judged by
  the bytes the kernel holds for it, peeked (`waiting_request`). So a normal request is served
  within seconds, however many slow ones are held or reconnect, and in whatever order they come;
- a connection counts until its socket is closed, not until its reply was handed to the kernel:
  a reply the client does not read (writing paused) for `write_timeout` is aborted, and so is one
  whose unsent bytes pass `max_buffered`, or the oldest paused ones while all connections'
  unsent bytes together pass `max_buffered_total`; the kernel's share is capped too (SO_SNDBUF
  `send_buffer`). Unread replies cannot pin memory or sockets.

`GuardedSite` is aiohttp's TCPSite with these connections; `raise_fd_limit` lifts the process's
soft RLIMIT_NOFILE toward its hard limit so the cap, not the OS, is what refuses.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from aiohttp import web

from engine.serve.guard import RateLimitedLog

try:  # FIONREAD: whether a connection that looks idle has request bytes waiting (POSIX)
    import fcntl
    import termios
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

REQUEST_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 15.0
WRITE_TIMEOUT_S = 15.0
MAX_CONNECTIONS = 512
SEND_BUFFER = 256 << 10  # the kernel's send buffer per connection (Linux doubles it): bounded, not autotuned to MBs
MAX_BUFFERED = 16 << 20  # unsent reply bytes one connection may hold
MAX_BUFFERED_TOTAL = 128 << 20  # ... and all of them together
HEAD_SCAN_LIMIT = 16 << 10  # request-head bytes `RequestScan` looks at (aiohttp refuses longer heads)
FD_RESERVE = 256  # descriptors kept for everything else (model files, the disk cache, logs)
MIN_CONNECTIONS = 16


@dataclass(frozen=True)
class Limits:
    request_timeout: float = REQUEST_TIMEOUT_S  # from a request's first byte to its last
    idle_timeout: float = IDLE_TIMEOUT_S  # no request in progress
    max_connections: int = MAX_CONNECTIONS
    write_timeout: float = WRITE_TIMEOUT_S  # a reply not read by the client (writing paused)
    max_buffered: int = MAX_BUFFERED
    max_buffered_total: int = MAX_BUFFERED_TOTAL
    send_buffer: int = SEND_BUFFER  # SO_SNDBUF of each connection

    def __post_init__(self) -> None:
        if (self.request_timeout <= 0 or self.idle_timeout <= 0 or self.write_timeout <= 0
                or self.max_connections < 1 or self.max_buffered < 1 or self.max_buffered_total < 1):
            raise ValueError("connection limits must be positive")


class RequestScan:
    """Whether a request's bytes are all in, from the bytes alone: the head up to its blank line,
    then Content-Length bytes of body (no Content-Length: none; chunked: unknown until the
    handler read it). Only the first request of a phase is scanned; pipelined ones are not."""

    def __init__(self) -> None:
        self.head = b""
        self.body_left: Optional[int] = None  # None: the head is not all in yet
        self.complete = False
        self.unknown = False  # chunked or unreadable: only the app can tell (`received`)

    def feed(self, data: bytes) -> None:
        if self.complete or self.unknown:
            return
        if self.body_left is None:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                if len(self.head) > HEAD_SCAN_LIMIT:
                    self.unknown = True
                return
            head, data = self.head[:end].lower(), self.head[end + 4:]
            self.head = b""
            if b"transfer-encoding:" in head:
                self.unknown = True
                return
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip() == b"content-length":
                    value = value.strip()
                    if not value.isdigit():
                        self.unknown = True
                        return
                    length = int(value)
            self.body_left = length
        self.body_left -= len(data)
        self.complete = self.body_left <= 0


IDLE, RECEIVING, HANDLING = "idle", "receiving", "handling"


class Connection(asyncio.Protocol):
    """One client connection: aiohttp's protocol (`inner`) behind it, its phase for the watchdog."""

    def __init__(self, guard: "ConnectionGuard", inner: asyncio.Protocol) -> None:
        self.guard, self.inner = guard, inner
        self.transport: Optional[asyncio.Transport] = None
        self.phase = IDLE
        self.since = guard.clock()  # when the current phase began
        self.early = False  # bytes of a next request came while this one was answered
        self.scan = RequestScan()
        self.paused_since: Optional[float] = None  # writing paused: the client is not reading
        self.closing = False  # closed by the guard, its unsent bytes (none) still going out
        self.arriving = False  # looked idle, but a whole request waits in the kernel (peeked): not evicted

    # -- asyncio.Protocol, delegated ------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:  # what a client that does not read can make the kernel hold for us
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.guard.limits.send_buffer)
            except OSError:
                pass
        self.guard._opened(self)
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if data:
            self.arriving = False
            if self.phase == IDLE:
                self.phase, self.since = RECEIVING, self.guard.clock()
            elif self.phase == HANDLING:
                self.early = True
            if self.phase == RECEIVING:
                self.scan.feed(data)
        self.inner.data_received(data)

    def eof_received(self) -> Optional[bool]:
        return self.inner.eof_received()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.guard._closed(self)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.paused_since = self.guard.clock()
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.paused_since = None
        self.inner.resume_writing()

    @property
    def complete(self) -> bool:
        """A request all in (received by the app, or every byte of it seen): never evicted."""
        return self.phase == HANDLING or (self.phase == RECEIVING and self.scan.complete)

    def buffered(self) -> int:
        """Reply bytes written but not yet taken by the kernel (the client is not reading)."""
        t = self.transport
        return t.get_write_buffer_size() if t is not None and not t.is_closing() else 0

    # -- phases, set by the app ----------------------------------------------------------------
    def received(self) -> None:
        """The request is all in (headers, and the body once read): no deadline while answered."""
        self.phase, self.since = HANDLING, self.guard.clock()

    def answered(self) -> None:
        """The response is sent: idle again until the next request's first byte (or receiving
        already, if bytes of the next one came meanwhile: pipelining)."""
        self.phase, self.since = (RECEIVING if self.early else IDLE), self.guard.clock()
        self.early = False
        self.scan = RequestScan()  # a pipelined next request is not scanned: only the app can tell
        if self.phase == RECEIVING:
            self.scan.unknown = True

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
        self.unread = 0  # replies aborted: not read within write_timeout, or too many bytes unsent
        self.checks = 0  # watchdog rounds so far (tests wait on these, not on the clock)
        self._tick: Optional[asyncio.TimerHandle] = None

    def factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], Connection]:
        return lambda: Connection(self, inner())

    def of(self, request: web.BaseRequest) -> Optional[Connection]:
        return self._by_transport.get(request.transport)

    def stats(self) -> dict[str, int]:
        return {"open": len(self.open), "limit": self.limits.max_connections, "timed_out": self.timed_out,
                "evicted": self.evicted, "idle_closed": self.idle_closed, "unread": self.unread,
                "buffered": sum(c.buffered() for c in self.open)}

    # -- bookkeeping ---------------------------------------------------------------------------
    def _opened(self, conn: Connection) -> None:
        self.open[conn] = None
        self._by_transport[conn.transport] = conn
        if len(self.open) > self.limits.max_connections:
            victim = self._victim(conn)
            self.evicted += 1
            self.log("evicted", f"local server: more than {self.limits.max_connections} connections open; "
                                "dropping the oldest half-open or idle one")
            if victim.phase == IDLE and victim is not conn:  # nothing unsent here: a plain close, so
                self.open.pop(victim, None)  # a reply the kernel still holds is delivered, not reset
                victim.closing = True
                if victim.transport is not None:
                    victim.transport.close()
            else:
                victim.drop()

    def _victim(self, newest: Connection) -> Connection:
        """The oldest half-open connection, else the one idle longest, else `newest`. A connection
        accepted in the same burst as many others looks idle until its bytes are read, so an idle
        one is peeked (`waiting_request`) before it is chosen: a partial request is half-open and
        goes, a whole one is passed over. Peeked only when no connection already read is half-open,
        and one at a time from the longest idle: under a flood no syscall is made per connection."""
        idle = []
        for c in self.open:  # oldest first
            if c is newest or c.closing or c.paused_since is not None or c.arriving:
                continue  # going already, a reply being written (the write timeout sees to it), or a request in
            if c.phase == RECEIVING and not c.complete:
                return c
            if c.phase == IDLE and not c.buffered():
                idle.append(c)
        for c in sorted(idle, key=lambda c: c.since):  # the one idle longest first, not a keep-alive that just answered
            waiting = waiting_request(c.transport)
            if waiting is not WHOLE:
                return c  # nothing waits (idle), or a partial request (half-open, not read yet)
            c.arriving = True  # accepted, its whole request waits in the kernel: it is not idle, it is next
        return newest  # all busy: the newcomer waits for none

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
        self.checks += 1
        now = self.clock()
        slow, idle = [], []
        for c in self.open:
            if c.closing:
                continue
            if c.phase == RECEIVING and not c.complete and now - c.since > self.limits.request_timeout:
                slow.append(c)
            elif c.phase == IDLE and now - c.since > self.limits.idle_timeout:
                idle.append(c)
        if slow:
            self.timed_out += len(slow)
            self.log("slow", f"local server: closed {len(slow)} connection(s) whose request was not fully "
                             f"received within {self.limits.request_timeout:g} s")
        for c in slow:
            c.drop()
        for c in idle:
            if c.buffered():  # an unread reply: close() would wait for the client for ever
                self.unread += 1
                c.drop()
            elif c.transport is not None:
                self.idle_closed += 1
                c.closing = True  # counted until connection_lost: the socket is really gone then
                c.transport.close()
        self._check_unread(now)
        self._schedule()

    def _check_unread(self, now: float) -> None:
        """Abort replies the client does not read: paused for write_timeout, or too big unsent."""
        lim = self.limits
        sizes = {c: c.buffered() for c in self.open}
        unread = [c for c, n in sizes.items() if n > lim.max_buffered
                  or (c.paused_since is not None and now - c.paused_since > lim.write_timeout)]
        total = sum(sizes.values()) - sum(sizes[c] for c in unread)
        for c in sorted((c for c in self.open if c.paused_since is not None and c not in unread),
                        key=lambda c: c.paused_since or 0.0):  # the longest paused first
            if total <= lim.max_buffered_total:
                break
            unread.append(c)
            total -= sizes[c]
        if unread:
            self.unread += len(unread)
            self.log("unread", f"local server: closed {len(unread)} connection(s) whose client did not read "
                               f"its reply (within {lim.write_timeout:g} s, or too many bytes unsent)")
        for c in unread:
            c.drop()


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


def unread_bytes(transport: Any) -> int:
    """Bytes the kernel holds for us on this connection, not yet read (FIONREAD); 0 if unknown."""
    if fcntl is None or transport is None:
        return 0
    sock = transport.get_extra_info("socket")
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
    except (OSError, AttributeError, ValueError):
        return 0


NOTHING, HALF, WHOLE = "nothing", "half", "whole"


def waiting_request(transport: Any) -> str:
    """What waits unread in the kernel on a connection aiohttp has not read yet: NOTHING, HALF (a
    partial request: its head, or its Content-Length of body, not all in) or WHOLE (a whole
    request, or one only the app can judge: chunked, or a head too long to scan). Peeked, not read."""
    n = unread_bytes(transport)
    if n <= 0:
        return NOTHING
    try:  # asyncio's TransportSocket has no recv: a socket object over the same descriptor, let go after
        peer = socket.socket(fileno=transport.get_extra_info("socket").fileno())
        try:
            peeked = peer.recv(min(n, HEAD_SCAN_LIMIT + 4), socket.MSG_PEEK)
        finally:
            peer.detach()
    except (OSError, AttributeError, ValueError):
        return WHOLE  # cannot tell: never drop what may be a whole request
    scan = RequestScan()
    scan.feed(peeked)
    if scan.complete or scan.unknown:
        return WHOLE
    if scan.body_left is None:  # the head is not all in
        return HALF
    return WHOLE if scan.body_left <= n - len(peeked) else HALF  # the body beyond the peeked bytes


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
