"""Plain TCP links between rank 0 and every other rank, beside MLX's own connections.

A peer that dies does not always make MLX's ring raise: a rank can stay blocked in a collective
for ever. These links notice at once: every follower holds one TCP connection to rank 0, and
the kernel closes it when a process dies, however it dies. A link that closes while the ranks
are not shutting down calls `on_lost` (rank 0 answers the request in flight and exits non-zero;
a follower exits non-zero).

They also let idle ranks sleep: a rank waiting in an MLX collective spins (the ring backend
polls its sockets: half a core per idle follower), so followers wait on their link instead,
and rank 0 sends one byte, WAKE, before each tick. A follower told to stop (SIGTERM) sends
STOP, and rank 0 then stops every rank.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from typing import Callable, Optional

from engine.distributed.group import Group, GroupError

ACCEPT_TIMEOUT_S = 60.0
WAKE, STOP = b"w", b"s"


def leader_ip() -> Optional[str]:
    """Rank 0's address as the launcher gave it to every rank (ring hostfile, JACCL coordinator)."""
    path = os.environ.get("MLX_HOSTFILE")
    if path:
        try:
            with open(path) as f:
                hosts = json.load(f)
            return str(hosts[0][0]).rsplit(":", 1)[0]
        except (OSError, ValueError, IndexError, KeyError, TypeError):
            return None
    coordinator = os.environ.get("MLX_JACCL_COORDINATOR")
    return coordinator.rsplit(":", 1)[0] if coordinator else None


class PeerLinks:
    def __init__(self, group: Group, on_lost: Callable[[str], None]) -> None:
        self.group, self.on_lost = group, on_lost
        self.on_stop: Callable[[], None] = lambda: None  # rank 0: a follower asked to stop
        self.active = False  # set up: followers sleep between ticks
        self.closing = False  # set before a clean shutdown: closed links are then expected
        self._socks: list[socket.socket] = []
        self._wakes = threading.Semaphore(0)

    def start(self) -> bool:
        """Set up the links (a collective: every rank calls it). False where no address is known."""
        ip = leader_ip() if self.group.rank == 0 else None
        server = None
        address = b""
        if ip is not None:
            server = socket.create_server((ip, 0))
            address = f"{ip}:{server.getsockname()[1]}".encode()
        announced = self.group.gather_bytes(address, "links")[0].decode()
        if not announced:
            return False
        try:
            if self.group.rank == 0:
                assert server is not None
                server.settimeout(ACCEPT_TIMEOUT_S)
                with server:
                    for _ in range(self.group.size - 1):
                        conn, _ = server.accept()
                        rank = int(conn.recv(16).decode() or "-1")
                        self._watch(conn, f"rank {rank}")
            else:
                host, port = announced.rsplit(":", 1)
                conn = socket.create_connection((host, int(port)), timeout=ACCEPT_TIMEOUT_S)
                conn.sendall(str(self.group.rank).encode())
                self._watch(conn, "rank 0")
        except (OSError, ValueError) as e:
            raise GroupError(f"rank {self.group.rank}: cannot link to the other ranks ({announced}): {e}") from e
        self.active = True
        return True

    # -- rank 0 -----------------------------------------------------------------------------
    def wake(self) -> None:
        """Before a tick: wake every follower (they wait on their link, not in MLX)."""
        for s in self._socks:
            try:
                s.sendall(WAKE)
            except OSError:
                pass  # its reader reports the loss

    # -- followers ----------------------------------------------------------------------------
    def wait_wake(self, stop_requested: Callable[[], bool], poll_s: float = 0.5) -> None:
        """Sleep until rank 0 announces a tick; tell it once if this rank was told to stop."""
        told = False
        while not self._wakes.acquire(timeout=poll_s):
            if stop_requested() and not told:
                told = True
                try:
                    self._socks[0].sendall(STOP)
                except OSError:
                    pass

    def _watch(self, conn: socket.socket, peer: str) -> None:
        conn.settimeout(None)
        self._socks.append(conn)

        def read() -> None:
            try:
                while data := conn.recv(4096):
                    for byte in data:
                        if byte == WAKE[0]:
                            self._wakes.release()
                        elif byte == STOP[0]:
                            self.on_stop()
            except OSError:
                pass
            if not self.closing:
                self.on_lost(f"{peer} is gone (its link to rank {self.group.rank} closed)")

        threading.Thread(target=read, name=f"verbatim-link-{peer}", daemon=True).start()

    def close(self) -> None:
        self.closing = True
        for s in self._socks:
            try:
                s.close()
            except OSError:
                pass
