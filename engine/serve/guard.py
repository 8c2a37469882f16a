"""What a web page cannot do to the local server: the checks made from a request's headers.

A browser lets any page send a "simple" cross-origin POST (no preflight) and, through DNS
rebinding, even read the reply. So, before any work and before the body is read:

- Host: only the loopback names with the server's port (localhost, 127.0.0.1, [::1]) and the
  bound address are served: the name it was bound to, and the IP the connection actually
  arrived on (on a wildcard bind, 0.0.0.0 or ::, any of this machine's, and its host name:
  it needs an API key there anyway). Anything else, a rebinding page's own name or an IP
  literal that is not this server's (10.9.9.9, 8.8.8.8), gets 421.
- Origin: a request that carries one gets 403 unless it is in `--allow-origin`; only those get
  CORS headers and an answered preflight (OPTIONS).
- Content-Type: a POST body must be `application/json` (415): a page cannot send that without
  a preflight, which only allowed origins pass.

Also `RateLimitedLog`: one log line per cause per minute however often it happens.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Optional
from urllib.parse import urlsplit

from engine.serve.schema import APIError

LOG_INTERVAL_S = 60.0
CORS_MAX_AGE_S = 600
WILDCARDS = ("0.0.0.0", "::", "")
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def normalize_origin(url: str) -> str:
    """'http://Example.com:80/' -> 'http://example.com' (scheme://host[:port], default port dropped);
    ValueError if it is not an http(s) origin."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) origin: {url!r}")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ValueError(f"an origin is scheme://host[:port] only, got {url!r}")
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    port = parts.port
    default = 443 if parts.scheme == "https" else 80
    return f"{parts.scheme}://{host}" + (f":{port}" if port and port != default else "")


def _host_name(host: str) -> str:
    return host.strip("[]").lower()


def _same_ip(a: str, b: str) -> bool:
    """Two spellings of one IP address ('::ffff:10.0.0.2' is '10.0.0.2'); False unless both are IPs."""
    try:
        x, y = ipaddress.ip_address(a), ipaddress.ip_address(b)
    except ValueError:
        return False
    x = x.ipv4_mapped or x if isinstance(x, ipaddress.IPv6Address) else x
    y = y.ipv4_mapped or y if isinstance(y, ipaddress.IPv6Address) else y
    return x == y


@dataclass
class BrowserGuard:
    """The Host and Origin checks for a server bound to `bind_host`:`port` (set once bound)."""

    bind_host: str
    port: int
    allow_origins: tuple[str, ...] = ()
    _names: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.allow_origins = tuple(normalize_origin(o) for o in self.allow_origins)
        names = set(LOOPBACK_NAMES)
        bound = _host_name(self.bind_host)
        if bound in WILDCARDS:
            try:
                names.update(n.lower() for n in (socket.gethostname(), socket.getfqdn()) if n)
            except OSError:
                pass
        else:
            names.add(bound)
        self._names = names

    def host_allowed(self, host: Optional[str], local_ip: Optional[str] = None) -> bool:
        """`host` (the Host header) names this server, with its port: a loopback name, the bound
        name, or `local_ip`, the address the connection arrived on."""
        if not host:
            return False
        host = host.strip()
        if host.startswith("["):  # [v6]:port
            name, _, rest = host[1:].partition("]")
            port_s = rest[1:] if rest.startswith(":") else ("" if not rest else None)
        else:
            name, sep, port_s = host.rpartition(":")
            if not sep:
                name, port_s = host, ""
        if port_s is None or (port_s and not port_s.isdigit()):
            return False
        port = int(port_s) if port_s else 80
        if port != self.port:
            return False
        name = name.lower().rstrip(".")
        if name in self._names or any(_same_ip(name, n) for n in self._names):
            return True
        return local_ip is not None and _same_ip(name, local_ip)

    def origin_allowed(self, origin: str) -> bool:
        try:
            return normalize_origin(origin) in self.allow_origins
        except ValueError:
            return False  # "null" (sandboxed frames, files) and anything malformed

    def check(self, method: str, headers: Mapping[str, str], local_ip: Optional[str] = None) -> Optional[str]:
        """The allowed Origin to answer with CORS headers (None: no Origin sent); APIError if refused.
        `local_ip`: the address the connection arrived on (this server's own)."""
        if not self.host_allowed(headers.get("Host"), local_ip):
            raise APIError(421, "this server answers only requests addressed to it by a loopback name "
                                "(127.0.0.1, localhost, [::1]) or its own address, with its port",
                           code="host_not_allowed")
        origin = headers.get("Origin")
        if origin is not None and not self.origin_allowed(origin):
            raise APIError(403, "requests from web pages are refused unless the server was started with "
                                "--allow-origin for that page's origin", code="origin_not_allowed")
        if method == "POST":
            ctype = headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
            if ctype != "application/json":
                raise APIError(415, "the request body must be JSON, sent with 'Content-Type: application/json'",
                               code="unsupported_media_type")
        return origin

    @staticmethod
    def cors_headers(origin: str) -> dict[str, str]:
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin",
                "Access-Control-Expose-Headers": "Retry-After"}

    @staticmethod
    def preflight_headers(origin: str) -> dict[str, str]:
        return {**BrowserGuard.cors_headers(origin),
                "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
                "Access-Control-Allow-Headers": "Authorization, Content-Type",
                "Access-Control-Max-Age": str(CORS_MAX_AGE_S)}


class RateLimitedLog:
    """At most one line per cause per `interval` seconds; the next says how many were held back."""

    def __init__(self, logger: logging.Logger, interval: float = LOG_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger, self.interval, self.clock = logger, interval, clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def __call__(self, cause: str, message: str, level: int = logging.WARNING,
                 exc_info: Optional[BaseException] = None) -> bool:
        """Log `message` unless `cause` was logged less than `interval` ago. True if logged."""
        now = self.clock()
        last = self._last.get(cause)
        if last is not None and now - last < self.interval:
            self._held[cause] = self._held.get(cause, 0) + 1
            return False
        held = self._held.pop(cause, 0)
        self._last[cause] = now
        self.logger.log(level, message + (f" (and {held} more like it since the last line)" if held else ""),
                        exc_info=exc_info)
        return True


class RateLimitFilter(logging.Filter):
    """A logging filter with `RateLimitedLog`'s rule: one record per (logger, message template)
    per interval. Put on aiohttp's and asyncio's loggers while a server runs, so a flood of bad
    connections cannot fill the log ("Too many open files", "Error handling request")."""

    def __init__(self, interval: float = LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval, self.clock = interval, clock
        self._last: dict[tuple[str, str], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        cause = (record.name, str(record.msg).split("\n", 1)[0][:200])  # the first line: the cause
        now = self.clock()
        last = self._last.get(cause)
        if last is not None and now - last < self.interval:
            return False
        self._last[cause] = now
        if len(self._last) > 1024:  # causes are templates, but keep the memo bounded anyway
            self._last = {k: v for k, v in self._last.items() if now - v < self.interval}
        return True


NOISY_LOGGERS = ("aiohttp.server", "aiohttp.web", "aiohttp.access", "asyncio")


def install_log_filter(names: Iterable[str] = NOISY_LOGGERS) -> Callable[[], None]:
    """Rate-limit the named loggers; returns the function that removes the filter again."""
    f = RateLimitFilter()
    loggers = [logging.getLogger(n) for n in names]
    for lg in loggers:
        lg.addFilter(f)

    def remove() -> None:
        for lg in loggers:
            lg.removeFilter(f)

    return remove
