"""Reading a file from anyone else within limits: a bad file is refused, never a stuck caller.

A PDF or a Word document is read in a process of its own (child.py), because PDFium cannot be
interrupted inside a page and no parser gives memory back reliably: that process is killed when
it passes its time (the whole file, or one page or stretch of XML) or its memory, and the file
is refused, naming the limit. Text is read here: decoding and the binary check are linear in a
size already bounded. The text is counted against the character budget as it is read, in both.

    read_file(path)                       the window's attachments, the CLI's --attach (LOCAL)
    read_bytes(name, data, mime)          the same from bytes, blocking the calling thread
    await read_bytes_async(...)           a server's file part (SERVER): on a worker thread, so
                                          the event loop and the engine thread go on

At most PROCESSES readers run at once; more wait their turn. Numbers: docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import functools
import json
import queue
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Optional

from engine.documents.document import MAX_TEXT_CHARS, Document, DocumentError, Extracted
from engine.documents.extract import check_size, finish, kind_of, read_text

PROCESSES = 2  # reader processes at once (each may take Limits.memory)
POLL_S = 0.02  # how often a reader's clock and memory are looked at


@dataclass(frozen=True)
class Limits:
    """What reading one file may take."""

    seconds: float  # the whole file, from the reader's start
    page_seconds: float  # between two steps of the reader (a PDF page, 64 KiB of a .docx's XML)
    memory: int  # bytes the reader process may hold (resident; also its address space on Linux)
    chars: int = MAX_TEXT_CHARS  # characters of text


# The user's own files (the window, the CLI): a slow page of a large drawing is still read.
LOCAL = Limits(seconds=120, page_seconds=20, memory=2 << 30)
# A server's clients: every hostile file measured is refused within about a second
# (docs/benchmarks.md); no legitimate page takes PDFium a second.
SERVER = Limits(seconds=20, page_seconds=1, memory=1 << 30)

_processes = threading.BoundedSemaphore(PROCESSES)
_pool: Optional[ThreadPoolExecutor] = None
_pool_lock = threading.Lock()


def read_file(path: str | Path, limits: Limits = LOCAL, cancel: Optional[threading.Event] = None) -> Document:
    """The document in the file at `path` (the name shown is the file's name)."""
    p = Path(path)
    name = p.name
    try:
        if not p.is_file():
            raise DocumentError(name, "not a regular file" if p.exists() else "no such file")
        check_size(name, p.stat().st_size)
        data = p.read_bytes()
    except OSError as e:
        raise DocumentError(name, f"cannot be read ({e.strerror or e})") from None
    return read_bytes(name, data, None, limits, cancel)


def read_bytes(name: str, data: bytes, mime: Optional[str] = None, limits: Limits = LOCAL,
               cancel: Optional[threading.Event] = None) -> Document:
    """The document in `data`, read within `limits` (blocks the calling thread; `cancel` set
    stops it, the file refused)."""
    check_size(name, len(data))
    kind = kind_of(name, data, mime)
    if kind == "text":
        got = Extracted(read_text(name, data, limits.chars))
    else:
        got = _Reader(name, kind, data, limits, cancel).run()
    return finish(name, data, kind, got, limits.chars)


async def read_bytes_async(name: str, data: bytes, mime: Optional[str] = None, limits: Limits = SERVER) -> Document:
    """`read_bytes` on a worker thread: the caller's event loop goes on meanwhile. Cancelling the
    awaiting task stops the reader."""
    cancel = threading.Event()
    loop = asyncio.get_running_loop()
    try:
        return await loop.run_in_executor(_workers(), functools.partial(read_bytes, name, data, mime, limits, cancel))
    except asyncio.CancelledError:
        cancel.set()
        raise


def _workers() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=2 * PROCESSES, thread_name_prefix="verbatim-read")
        return _pool


def child_command() -> list[str]:
    """How to start a reader process: this Python with `-m engine.documents.child`, or, inside
    the app bundle (whose executable is the app, not Python), the app with --read-document
    (packaging/briefcase/verbatim/__main__.py)."""
    if Path(sys.executable).name.lower().startswith("python"):
        return [sys.executable, "-m", "engine.documents.child"]
    return [sys.executable, "--read-document"]


_EOF = object()


class _Reader:
    """One file in a reader process (child.py), watched: its clock, its steps, its memory."""

    def __init__(self, name: str, kind: str, data: bytes, limits: Limits, cancel: Optional[threading.Event]) -> None:
        self.name, self.kind, self.data, self.limits = name, kind, data, limits
        self.cancel = cancel or threading.Event()
        self.lines: "queue.Queue[Any]" = queue.Queue()

    def run(self) -> Extracted:
        while not _processes.acquire(timeout=0.1):
            if self.cancel.is_set():
                raise DocumentError(self.name, "reading it was cancelled")
        try:
            return self._run()
        finally:
            _processes.release()

    def _run(self) -> Extracted:
        proc = subprocess.Popen(child_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, close_fds=True)
        assert proc.stdin is not None and proc.stdout is not None
        header = {"name": self.name, "kind": self.kind, "size": len(self.data), "chars": self.limits.chars,
                  "memory": self.limits.memory}
        writer = threading.Thread(target=_write, args=(proc.stdin, json.dumps(header).encode() + b"\n", self.data),
                                  name="verbatim-read-in", daemon=True)
        reader = threading.Thread(target=self._read, args=(proc.stdout,), name="verbatim-read-out", daemon=True)
        writer.start()
        reader.start()
        try:
            return self._watch(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            writer.join()
            reader.join()
            proc.stdout.close()

    def _read(self, out: IO[bytes]) -> None:
        """The reader's messages, one JSON object a line, onto the queue; _EOF at its end."""
        limit = 12 * self.limits.chars + (1 << 16)  # the text, every character escaped
        try:
            while line := out.readline(limit):
                try:
                    self.lines.put(json.loads(line))
                except ValueError:
                    break
        finally:
            self.lines.put(_EOF)

    def _watch(self, proc: subprocess.Popen) -> Extracted:
        import psutil

        limits = self.limits
        started = time.monotonic()
        stepped: Optional[float] = None  # the last step's start (none before its first: startup is not a page)
        watched = psutil.Process(proc.pid)
        while True:
            try:
                msg = self.lines.get(timeout=POLL_S)
            except queue.Empty:
                msg = None
            now = time.monotonic()
            if msg is _EOF:
                break
            if isinstance(msg, dict):
                if msg.get("t") == "step":
                    stepped = now
                elif msg.get("t") == "done":
                    return Extracted(str(msg["text"]), msg.get("pages"), tuple(msg.get("unread", ())))
                elif msg.get("t") == "error":
                    raise DocumentError(self.name, str(msg.get("why")))
            if self.cancel.is_set():
                raise DocumentError(self.name, "reading it was cancelled")
            if now - started > limits.seconds:
                raise DocumentError(self.name, f"took more than {limits.seconds:g} s to read: refused")
            if stepped is not None and now - stepped > limits.page_seconds:
                step = "a page" if self.kind == "pdf" else "64 KiB of its XML"
                raise DocumentError(self.name, f"{step} took more than {limits.page_seconds:g} s to read: refused")
            try:
                rss = watched.memory_info().rss
            except psutil.Error:
                rss = 0
            if rss > limits.memory:
                raise DocumentError(self.name, _too_much_memory(limits.memory))
        code = proc.wait()
        how = f"signal {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() else f"exit {code}"
        raise DocumentError(self.name, f"cannot be read: the reader stopped without an answer ({how}); a broken file, "
                                       f"or it needed more than the {limits.memory >> 20:,} MiB of memory it may use")


def _too_much_memory(limit: int) -> str:
    return f"needs more than {limit >> 20:,} MiB of memory to read: refused"


def _write(stdin: IO[bytes], header: bytes, data: bytes) -> None:
    try:
        stdin.write(header)
        stdin.write(data)
    except (BrokenPipeError, OSError, ValueError):  # the reader died or was killed: the watch says why
        pass
    finally:
        try:
            stdin.close()
        except OSError:
            pass
