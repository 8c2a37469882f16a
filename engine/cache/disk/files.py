"""File primitives of the disk tier: durable writes (fsync), quiet deletes, hashing, and safe reads
(regular files only, size and JSON depth bounded: a hostile cache file is damage, never a hang)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
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



class DamagedFile(ValueError):
    """A cache file that is not safe to read: a link, a FIFO, a device, too large, too deep."""


def read_regular(path: Path, max_bytes: int) -> bytearray:
    """The bytes of `path` if it is a regular file of at most `max_bytes`, opened without
    following a symlink and without blocking (a FIFO opens at once and is refused); else
    `DamagedFile`. FileNotFoundError passes through: a missing file is no damage. Read straight
    into one buffer of the file's size (no chunks joined: a pack is hundreds of MB)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as e:
        if os.path.islink(path):
            raise DamagedFile(f"{path.name} is a symbolic link") from None
        raise DamagedFile(f"{path.name} cannot be opened ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DamagedFile(f"{path.name} is not a regular file (a FIFO, device or folder)")
        if st.st_size > max_bytes:
            raise DamagedFile(f"{path.name} is {st.st_size} bytes, over the bound of {max_bytes}")
        # One byte more than the size shows a file that grew meanwhile (up to the bound).
        buf = bytearray(min(st.st_size, max_bytes) + 1)
        view, n = memoryview(buf), 0
        while n < len(buf):
            got = os.readv(fd, [view[n:]])
            if not got:
                break
            n += got
        view.release()
        while n == len(buf) and n <= max_bytes:  # it grew since fstat: read on, up to the bound
            more = os.read(fd, min(max_bytes + 1 - n, 1 << 20))
            if not more:
                break
            buf += more
            n += len(more)
        if n > max_bytes:
            raise DamagedFile(f"{path.name} is over the bound of {max_bytes} bytes")
        del buf[n:]
        return buf
    finally:
        os.close(fd)


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_JSON_BRACKET = re.compile(rb"[\[\]{}]")


def json_depth(data: bytes) -> int:
    """How deeply `data`'s arrays and objects nest (strings skipped): checked before parsing, so a
    file of a hundred thousand brackets is refused instead of exhausting the parser's recursion."""
    depth = top = 0
    for m in _JSON_BRACKET.finditer(_JSON_STRING.sub(b'""', data)):
        depth += 1 if m.group() in (b"[", b"{") else -1
        top = max(top, depth)
    return top


def load_json(data: bytes, max_depth: int) -> Any:
    """`json.loads` of data nested at most `max_depth` deep; `DamagedFile` otherwise."""
    if json_depth(data) > max_depth:
        raise DamagedFile(f"it nests deeper than {max_depth} levels")
    try:
        return json.loads(data)
    except RecursionError:
        raise DamagedFile("it nests too deeply to parse") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise DamagedFile(f"not valid JSON ({e})") from None
