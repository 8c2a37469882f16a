"""File primitives of the disk tier: durable writes (fsync), quiet deletes, hashing."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional


def fsync(fd: int) -> None:
    # macOS fsync does not flush the drive's cache; F_FULLFSYNC does (same as the store).
    if sys.platform == "darwin":
        import fcntl

        try:
            fcntl.fcntl(fd, fcntl.F_FULLFSYNC)
            return
        except OSError:
            pass
    os.fsync(fd)


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on directories; the rename is still atomic
    finally:
        os.close(fd)


def unlink(p: Path) -> None:
    try:
        os.unlink(p)
    except FileNotFoundError:
        pass
    except OSError:
        pass  # a read-only folder: the index no longer lists it, which is what matters


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class HashingWriter:
    """A file object for `mx.save_safetensors` that hashes what it writes (no second read).

    If the writer ever seeks backwards the running hash no longer matches the file; we notice
    and fall back to hashing the file. `on_write(n)` runs after the n-th write (the writer
    pauses there while a generation holds writes).
    """

    def __init__(self, f: Any, on_write: Callable[[int], None]) -> None:
        self._f = f
        self._on_write = on_write
        self.hash = hashlib.sha256()
        self.pos = 0
        self.linear = True
        self.writes = 0
        self.error: Optional[OSError] = None

    def write(self, b: Any) -> int:
        if self._f.tell() != self.pos:
            self.linear = False
        try:
            n = self._f.write(b)
        except OSError as e:
            self.error = e  # keep the errno: MLX may re-raise it as another type
            raise
        self.hash.update(b)
        self.pos += memoryview(b).nbytes
        self.writes += 1
        self._on_write(self.writes)
        return n

    def seek(self, *args: Any) -> int:
        return self._f.seek(*args)

    def tell(self) -> int:
        return self._f.tell()

    def flush(self) -> None:
        self._f.flush()

    @property
    def closed(self) -> bool:
        return self._f.closed

