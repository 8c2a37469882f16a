"""The distributed group and the few control collectives the ranks exchange.

Control messages are small: a vector of int32 summed over the ranks (each rank writes its own
slot or adds its vote), and bytes sent by one rank to all (`all_sum` where every other rank
contributes zeros, as mlx_lm.server broadcasts requests). Every collective runs on the thread
that owns the engine (MLX streams are per thread) and marks progress for the watchdog. The ranks
complete a control collective at least every tick while idle and every step while generating,
so a rank that has completed none for `timeout_s` prints why and exits non-zero rather than
hang (a peer that died closes its sockets and MLX raises at once; the watchdog covers a peer
that is alive but stuck, inside a forward's collectives as much as in a control one).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import mlx.core as mx

from engine.errors import EngineError

DEFAULT_TIMEOUT_S = 120.0  # a control collective that waits longer than this means a stuck peer
GRACE_S = 10.0  # after a stuck peer is reported: time to answer the client before exiting
EXIT_GROUP_FAILED = 3  # exit status of a rank whose group failed (a peer died, hung or broke off)


class GroupError(EngineError):
    """The distributed group failed: a peer died, hung, or the ranks fell out of step."""


def launched() -> bool:
    """Was this process started as one rank of several (mlx.launch sets these)? A ring hostfile
    of one host (or the empty one `mlx.launch -n 1` writes) is a single process."""
    hostfile = os.environ.get("MLX_HOSTFILE")
    if hostfile:
        try:
            with open(hostfile) as f:
                text = f.read().strip()
            return bool(text) and len(json.loads(text)) > 1
        except (OSError, ValueError, TypeError):
            return True  # unreadable: let MLX say what is wrong with it
    return bool(os.environ.get("MLX_IBV_DEVICES") or os.environ.get("MLX_JACCL_COORDINATOR")
                or os.environ.get("OMPI_COMM_WORLD_SIZE"))


@dataclass
class Group:
    """This process's place in the group, and the control collectives over it."""

    group: Any  # mx.distributed.Group
    rank: int
    size: int
    host: str
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        self._last = time.monotonic()  # when the last control collective completed
        self._what = "start"
        self.idle = False  # waiting for work, not for the other ranks: the watchdog looks away

    # -- collectives -------------------------------------------------------------------------
    def sum_ints(self, values: Sequence[int], what: str = "control") -> list[int]:
        """Element-wise sum over the ranks of an int32 vector. A tag naming the exchange goes
        first: ranks that fell out of step (one in a tick, another in a cancel check) would
        otherwise sum vectors of the same length that mean different things."""
        tag = zlib.crc32(what.encode()) & 0x7FFF
        out = [int(v) for v in self._run(mx.array([tag, *values], dtype=mx.int32), what).tolist()]
        if out[0] != tag * self.size:
            raise GroupError(f"rank {self.rank}: the ranks are out of step (this one is in {what})")
        return out[1:]

    def min_max(self, value: int, what: str = "agree") -> tuple[int, int]:
        """(min, max) over the ranks of one int, in one all-reduce (rank r writes slot r)."""
        slots = [0] * self.size
        slots[self.rank] = value
        every = self.sum_ints(slots, what)
        return min(every), max(every)

    def broadcast_bytes(self, data: Optional[bytes], size: int, what: str = "message") -> bytes:
        """Rank 0's `data` (of `size` bytes, announced before) on every rank."""
        buf = mx.array(memoryview(data), dtype=mx.uint8) if self.rank == 0 else mx.zeros(size, dtype=mx.uint8)
        return bytes(memoryview(self._run(buf, what)))

    def gather_bytes(self, data: bytes, what: str = "gather") -> list[bytes]:
        """Every rank's `data`, in rank order, on every rank (two all-reduces)."""
        sizes = [0] * self.size
        sizes[self.rank] = len(data)
        sizes = self.sum_ints(sizes, what)
        start = sum(sizes[: self.rank])
        buf = bytearray(sum(sizes))
        buf[start : start + len(data)] = data
        summed = bytes(memoryview(self._run(mx.array(memoryview(buf), dtype=mx.uint8), what)))
        out, pos = [], 0
        for n in sizes:
            out.append(summed[pos : pos + n])
            pos += n
        return out

    def barrier(self, what: str = "barrier") -> None:
        self.sum_ints([1], what)

    def _run(self, x: mx.array, what: str) -> mx.array:
        self._what = what
        try:
            y = mx.distributed.all_sum(x, group=self.group, stream=mx.cpu)
            mx.eval(y)
        except RuntimeError as e:  # MLX: "[ring] connection to a peer was lost"
            raise GroupError(f"rank {self.rank}: the distributed group failed during {what}: {e}") from e
        self._last = time.monotonic()
        return y

    # -- watchdog -------------------------------------------------------------------------------
    def start_watchdog(self, on_stuck: Optional[Callable[[str], None]] = None) -> None:
        """When no control collective completed for `timeout_s` (call once loaded): `on_stuck(why)`
        (rank 0 answers its client and stops), and exit non-zero if the process is still here
        `GRACE_S` later; without `on_stuck`, exit at once."""
        self._last = time.monotonic()
        threading.Thread(target=self._watch, args=(on_stuck,), name="verbatim-rank-watchdog", daemon=True).start()

    def _watch(self, on_stuck: Optional[Callable[[str], None]]) -> None:
        tick = min(1.0, self.timeout_s / 4)
        while True:
            time.sleep(tick)
            if self.idle:
                self._last = time.monotonic()
            elif time.monotonic() - self._last > self.timeout_s:
                why = (f"rank {self.rank} heard nothing from the other ranks for {self.timeout_s:g} s "
                       f"(last: {self._what}): a peer is stuck or gone")
                try:
                    print(f"error: {why}; exiting", file=sys.stderr, flush=True)
                except (OSError, ValueError):  # nobody reads our output any more: exit anyway
                    pass
                if on_stuck is not None:
                    on_stuck(why)
                    time.sleep(GRACE_S)
                os._exit(EXIT_GROUP_FAILED)


def init_group(timeout_s: float = DEFAULT_TIMEOUT_S) -> Group:
    """Join the group mlx.launch set up (strict: a launched process that cannot join fails)."""
    try:
        g = mx.distributed.init(strict=launched())
    except RuntimeError as e:
        raise GroupError(f"cannot join the distributed group: {e}") from e
    return Group(g, g.rank(), g.size(), socket.gethostname(), timeout_s)


def rank_cache_dir(root: os.PathLike[str] | str, rank: int, size: int) -> str:
    """Each rank's own prompt-cache folder under the shared cache dir."""
    return os.path.join(os.fspath(root), f"rank-{rank}-of-{size}")
