"""One Verbatim instance per data directory.

An exclusive `flock` on `<data_dir>/verbatim.lock`. The kernel drops it when the holding process
exits for any reason (SIGKILL included), so there is no stale-lock cleanup and no PID guessing.
A second instance either opens the conversation store read-only (`ConversationStore(read_only=True)`)
or refuses to start (`require_instance_lock`, whose error message says who holds the lock).

flock locks belong to the open file description: the descriptor is opened non-inheritable (Python's
default, PEP 446) so a child process cannot keep the lock alive after the app dies. flock is not
reliable on some network file systems; the data dir is expected to be local.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

LOCK_NAME = "verbatim.lock"


class InstanceLockedError(RuntimeError):
    """Another Verbatim instance holds the data directory (message is user-facing)."""


@dataclass
class InstanceLock:
    """A held lock; release it (or let the process end) to free the data dir.

    Deliberately no __del__: an app that drops the object keeps the lock until it exits, which is
    the safe direction."""

    path: Path
    _fd: Optional[int] = field(default=None, repr=False)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> "InstanceLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_path(data_dir: Union[str, Path]) -> Path:
    return Path(data_dir) / LOCK_NAME


def acquire_instance_lock(data_dir: Union[str, Path]) -> Optional[InstanceLock]:
    """Take the data dir's lock without waiting; None if another process (or open lock) holds it."""
    path = lock_path(data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    # O_RDWR without O_TRUNC: truncating before we own the lock would wipe the holder's pid.
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    # Record the holder so a refused instance can say who it is (information only, never trusted).
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return InstanceLock(path, fd)


def lock_holder_pid(data_dir: Union[str, Path]) -> Optional[int]:
    """The pid written by the last holder, if readable (may be stale once the lock is free)."""
    try:
        text = lock_path(data_dir).read_text().strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


def require_instance_lock(data_dir: Union[str, Path]) -> InstanceLock:
    """Take the lock or raise InstanceLockedError with a message fit for the user."""
    lock = acquire_instance_lock(data_dir)
    if lock is None:
        pid = lock_holder_pid(data_dir)
        who = f" (process {pid})" if pid else ""
        raise InstanceLockedError(
            f"Verbatim is already running{who} with the data folder {Path(data_dir)}. "
            "Close the other window first, or open this one read-only."
        )
    return lock
