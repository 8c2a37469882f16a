"""A reconnecting connection flood against a server on loopback (issue 29): the test's and
bench/flood.py's one client. Every client reconnects as soon as it is dropped; even ones send
nothing, odd ones half a request head. Bounded by the caller's stop flag."""

from __future__ import annotations

import asyncio
from typing import Callable


def reconnect_flood(port: int, clients: int, stopped: Callable[[], bool], connected: Callable[[], None],
                    retry_s: float = 0.01, poll_s: float = 0.2) -> None:
    """Run `clients` reconnecting connections to 127.0.0.1:`port` on a loop of their own until
    `stopped()`; `connected()` is called once per connection made."""
    host = f"127.0.0.1:{port}".encode()

    async def one(i: int) -> None:
        while not stopped():
            try:
                r, w = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(retry_s)
                continue
            connected()
            if i % 2:
                w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: " + host + b"\r\nContent-Ty")
            try:
                while not stopped():
                    try:
                        if not await asyncio.wait_for(r.read(1024), poll_s):
                            break
                    except asyncio.TimeoutError:
                        continue
            except OSError:
                pass
            w.close()

    async def main() -> None:
        await asyncio.gather(*(one(i) for i in range(clients)))

    asyncio.run(main())
