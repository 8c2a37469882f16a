"""The disk tier of the prompt cache: snapshots that survive restarts (G2).

Layout under the cache root (``platformdirs.user_cache_dir("Verbatim")/prompt-cache`` or the
``--cache-dir`` given)::

    index.json                    every entry's SnapshotMeta + file size + sha256 of the file
    snapshots/<id>.safetensors    one snapshot: each layer's state (arrays as tensors, the rest
                                  as JSON in the safetensors metadata, with the meta fields again)
    .lock                         flock held by the one process allowed to write

Invariants, and why they hold:

- A file under its final name is complete: it is written as ``snapshots/.tmp-*``, fsynced, and
  only then renamed. Temp files are never entries and are deleted on open.
- The index is written (temp + fsync + rename) *before* the snapshot file is renamed into place,
  so a crash leaves at worst an index entry without a file (dropped on open), never an unlisted
  file. A file the index does not list (only possible if index.json was lost or damaged) is
  deleted on open: without its checksum nothing vouches for its bytes, and it is only a cache.
- ``load()`` reads the file once, checks its sha256 and its header against the index entry, and
  only then builds cache objects: a flipped, truncated, swapped or missing file raises
  ``SnapshotError`` and its entry is removed. Nothing partial is ever restored.
- Only ids matching ``_ID_RE`` ever become paths, so no index content can reach outside the root.
- Each entry records the compute environment (MLX and mlx-lm versions, device, BLAS libraries):
  a state computed by other kernels is not bit-equal to a cold run here (G3), and unlike the
  memory tier the disk outlives an app update or a BLAS change. Entries from another environment
  are kept (within the budget) but never returned.
- All disk I/O (snapshot files, index, deletions) runs on one writer thread; ``save_async`` only
  appends to a queue. Snapshot arrays are already evaluated (``clone_cache``), so serialising them
  off the engine thread needs no MLX stream (checked: ``mx.save_safetensors`` works there).
- I/O errors (disk full, read-only dir) never reach the generation: they are counted, the first
  one becomes a user-facing warning, and the memory tier keeps working.
"""

from __future__ import annotations

import atexit
import errno
import hashlib
import io
import json
import os
import re
import shutil
import sys
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache, QuantizedKVCache, RotatingKVCache

from engine.blas import blas_library
from engine.cache.planner import SnapshotMeta, dominates
from engine.cache.snapshot import Snapshot, layer_offset
from engine.errors import SnapshotError
from engine.paths import prompt_cache_dir
from engine.threads import lower_thread_priority

WRITER_NICE = 19  # the lowest priority: below the engine worker (5) and the GUI (0)
FORMAT = "verbatim-prompt-cache"
FORMAT_VERSION = 2  # 2: exact_cuts replaces canonical / prefill_end / prefill_exact
INDEX_NAME = "index.json"
SNAP_DIR = "snapshots"
LOCK_NAME = ".lock"
TMP_PREFIX = ".tmp-"
DEFAULT_MAX_BUDGET = 10 << 30
DEFAULT_FREE_FRACTION = 0.25
MAX_PENDING_BYTES = 1 << 30  # snapshots queued for writing; beyond this the oldest are dropped
INDEX_RETRY_S = 5.0  # after a failed index write (disk full), wait this long before retrying

# Sanity limits for anything read back from disk (index or file header): hostile or corrupt
# metadata is rejected instead of allocating or looping on absurd values.
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_KEY_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
MAX_TOKENS = 1 << 22
MAX_TOKEN_ID = 1 << 31
MAX_LAYERS = 4096
MAX_FILE_BYTES = 1 << 40
MAX_INDEX_BYTES = 512 << 20
MAX_HEADER_BYTES = 256 << 20
KINDS = ("pre-last", "end", "boundary", "partial")
MAX_ENV_LEN = 1024

# Cache classes whose whole state is `.state` (arrays and scalars) and can be rebuilt with
# `from_state`. Anything else is not written (counted as skipped) and never instantiated on load.
CACHE_CLASSES: dict[str, type] = {
    c.__name__: c for c in (KVCache, QuantizedKVCache, RotatingKVCache, ArraysCache)
}


_ENV: Optional[str] = None


def compute_env() -> str:
    """What, besides the model key, decides the bits of a forward: versions, device, BLAS."""
    global _ENV
    if _ENV is None:
        import platform

        import mlx_lm

        _ENV = (f"mlx {mx.__version__}; mlx-lm {mlx_lm.__version__}; {mx.default_device()}; "
                f"{platform.system()} {platform.machine()}; blas {blas_library()}")[:MAX_ENV_LEN]
    return _ENV


def _fsync(fd: int) -> None:
    # macOS fsync does not flush the drive's cache; F_FULLFSYNC does (same as the store).
    if sys.platform == "darwin":
        import fcntl

        try:
            fcntl.fcntl(fd, fcntl.F_FULLFSYNC)
            return
        except OSError:
            pass
    os.fsync(fd)


def _fsync_dir(path: Path) -> None:
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


# ---------------------------------------------------------------------------------------------
# Test hooks: fault tests in a child process pause the writer at a named point and kill it there.
# VERBATIM_DISK_CACHE_HOOK='{"trace": "/path/file", "sleep": {"temp_partial": 30}}'.
# Points, in order: begin, temp_partial, temp_synced, index_written, renamed, done.


def _load_hook() -> dict[str, Any]:
    raw = os.environ.get("VERBATIM_DISK_CACHE_HOOK")
    if not raw:
        return {}
    try:
        hook = json.loads(raw)
        return hook if isinstance(hook, dict) else {}
    except ValueError:
        return {}


# ---------------------------------------------------------------------------------------------
# Serialisation: cache objects <-> (tensors, JSON structure)


def _encode_state(x: Any, path: str, tensors: dict[str, mx.array]) -> Any:
    """A JSON tree for a layer's state; arrays go to `tensors` under their tree path."""
    if isinstance(x, mx.array):
        tensors[path] = x
        return {"a": path}
    if isinstance(x, (list, tuple)):
        tag = "l" if isinstance(x, list) else "t"
        return {tag: [_encode_state(v, f"{path}.{i}", tensors) for i, v in enumerate(x)]}
    if x is None or isinstance(x, (bool, int, float, str)):
        return {"v": x}
    raise TypeError(f"unserialisable cache state element: {type(x).__name__}")


def _decode_state(node: Any, tensors: dict[str, mx.array], depth: int = 0) -> Any:
    if depth > 8 or not isinstance(node, dict) or len(node) != 1:
        raise SnapshotError("bad state structure")
    (tag, val), = node.items()
    if tag == "a":
        if not isinstance(val, str) or val not in tensors:
            raise SnapshotError("state refers to a missing tensor")
        return tensors[val]
    if tag in ("l", "t"):
        if not isinstance(val, list) or len(val) > 64:
            raise SnapshotError("bad state list")
        items = [_decode_state(v, tensors, depth + 1) for v in val]
        return items if tag == "l" else tuple(items)
    if tag == "v":
        if val is not None and not isinstance(val, (bool, int, float, str)):
            raise SnapshotError("bad state scalar")
        return val
    raise SnapshotError("bad state tag")


def meta_to_dict(meta: SnapshotMeta) -> dict[str, Any]:
    return {
        "id": meta.id,
        "model_key": meta.model_key,
        "tokens": list(meta.tokens),
        "kind": meta.kind,
        "exact_cuts": list(meta.exact_cuts),
        "classes": list(meta.classes),
        "trimmable": meta.trimmable,
        "nbytes": meta.nbytes,
    }


def _is_int(x: Any, lo: int, hi: int) -> bool:
    return type(x) is int and lo <= x <= hi


def meta_from_dict(d: Any) -> SnapshotMeta:
    """Validate untrusted metadata (index entry or file header); raise ValueError if bad."""
    if not isinstance(d, dict):
        raise ValueError("entry is not an object")
    sid = d.get("id")
    if not isinstance(sid, str) or not _ID_RE.match(sid):
        raise ValueError(f"bad id {str(sid)[:80]!r}")
    key = d.get("model_key")
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise ValueError("bad model key")
    tokens = d.get("tokens")
    if not isinstance(tokens, list) or not 0 < len(tokens) <= MAX_TOKENS:
        raise ValueError("bad token list")
    if not all(_is_int(t, 0, MAX_TOKEN_ID) for t in tokens):
        raise ValueError("bad token id")
    n = len(tokens)
    if d.get("kind") not in KINDS:
        raise ValueError("bad kind")
    cuts = d.get("exact_cuts")
    if not isinstance(cuts, list) or not all(_is_int(c, 1, n) for c in cuts) or cuts != sorted(set(cuts)):
        raise ValueError("bad exact cuts")
    if type(d.get("trimmable")) is not bool:
        raise ValueError("bad trimmable")
    classes = d.get("classes")
    if not isinstance(classes, list) or not 0 < len(classes) <= MAX_LAYERS:
        raise ValueError("bad classes")
    if not all(c in CACHE_CLASSES for c in classes):
        raise ValueError("unknown cache class")
    if not _is_int(d.get("nbytes"), 0, MAX_FILE_BYTES):
        raise ValueError("bad nbytes")
    return SnapshotMeta(
        id=sid,
        model_key=key,
        tokens=tuple(tokens),
        kind=d["kind"],
        exact_cuts=tuple(cuts),
        classes=tuple(classes),
        trimmable=d["trimmable"],
        nbytes=d["nbytes"],
    )


def read_header(data_or_file: Any) -> dict[str, Any]:
    """The safetensors header of a file (path) or of bytes, size-checked before parsing."""
    if isinstance(data_or_file, (bytes, bytearray, memoryview)):
        data = bytes(data_or_file[:8])
        if len(data) < 8:
            raise ValueError("file too short")
        n = int.from_bytes(data, "little")
        if n > MAX_HEADER_BYTES or n + 8 > len(data_or_file):
            raise ValueError("bad header length")
        raw = bytes(data_or_file[8 : 8 + n])
    else:
        with open(data_or_file, "rb") as f:
            data = f.read(8)
            if len(data) < 8:
                raise ValueError("file too short")
            n = int.from_bytes(data, "little")
            if n > MAX_HEADER_BYTES:
                raise ValueError("bad header length")
            raw = f.read(n)
            if len(raw) != n:
                raise ValueError("truncated header")
    header = json.loads(raw)
    if not isinstance(header, dict):
        raise ValueError("header is not an object")
    return header


def file_meta(header: dict[str, Any]) -> tuple[SnapshotMeta, list[Any]]:
    """(meta, per-layer state structure) from a snapshot file's header."""
    md = header.get("__metadata__")
    if not isinstance(md, dict) or md.get("format") != FORMAT:
        raise ValueError("not a Verbatim snapshot")
    try:
        version = int(md.get("version", ""))
    except ValueError:
        raise ValueError("bad format version") from None
    if version != FORMAT_VERSION:
        raise ValueError(f"unsupported format version {version}")
    meta = meta_from_dict(json.loads(md.get("meta", "null")))
    layers = json.loads(md.get("layers", "null"))
    if not isinstance(layers, list) or len(layers) != len(meta.classes):
        raise ValueError("layer structure does not match the classes")
    return meta, layers


@dataclass
class Entry:
    meta: SnapshotMeta
    file_bytes: int
    sha256: str
    created: float
    last_used: float
    env: str  # compute_env() of the process that computed it

    def to_dict(self) -> dict[str, Any]:
        return {
            **meta_to_dict(self.meta),
            "env": self.env,
            "file_bytes": self.file_bytes,
            "sha256": self.sha256,
            "created": self.created,
            "last_used": self.last_used,
        }


def entry_from_dict(d: Any) -> Entry:
    meta = meta_from_dict(d)
    fb, sha = d.get("file_bytes"), d.get("sha256")
    if not _is_int(fb, 1, MAX_FILE_BYTES):
        raise ValueError("bad file size")
    if not isinstance(sha, str) or not _SHA_RE.match(sha):
        raise ValueError("bad checksum")
    times = [d.get("created", 0.0), d.get("last_used", 0.0)]
    if not all(isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t < 1e11 for t in times):
        raise ValueError("bad timestamps")
    env = d.get("env")
    if not isinstance(env, str) or len(env) > MAX_ENV_LEN:
        raise ValueError("bad environment")
    return Entry(meta, fb, sha, float(times[0]), float(times[1]), env)


class _HashingWriter:
    """A file object for `mx.save_safetensors` that hashes what it writes (no second read).

    If the writer ever seeks backwards the running hash no longer matches the file; we notice
    and fall back to hashing the file. Test hooks can pause after the first data write.
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


# ---------------------------------------------------------------------------------------------


@dataclass
class _Task:
    kind: str  # "save" | "delete" | "clear" | "sync"
    snapshot: Optional[Snapshot] = None
    ids: list[str] = field(default_factory=list)
    nbytes: int = 0


class DiskCache:
    """The persistent tier behind `PromptCache` (satisfies `prompt_cache.DiskTier`).

    The index lives in memory (loaded and validated once on open, kept in sync by the writer
    thread), so `entries()` never touches the disk. Only the engine thread calls `load()`.
    """

    def __init__(
        self,
        root: Optional[Path | str] = None,
        budget_bytes: Optional[int] = None,
        on_warning: Optional[Callable[[str], None]] = None,
        max_pending_bytes: int = MAX_PENDING_BYTES,
    ) -> None:
        self.root = Path(root).expanduser() if root is not None else prompt_cache_dir()
        self.snap_dir = self.root / SNAP_DIR
        self.index_path = self.root / INDEX_NAME
        self.on_warning = on_warning
        self.max_pending_bytes = max_pending_bytes
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._entries: dict[str, Entry] = {}
        self._by_key: dict[str, dict[str, SnapshotMeta]] = {}
        self._queue: deque[_Task] = deque()
        self._pending_bytes = 0
        self._busy = False
        self._holds = 0  # generations in progress: the writer waits for them (see hold_writes)
        self._flushers = 0  # callers in flush(): a hold must not make them wait for ever
        self._stop = False
        self._dirty = False
        self._lock_fd: Optional[int] = None
        self._hook = _load_hook()
        self.env = compute_env()
        # stats
        self.writes = 0
        self.write_errors = 0
        self.write_seconds = 0.0
        self.bytes_written = 0
        self.loads = 0
        self.load_errors = 0
        self.evictions = 0
        self.skipped = 0
        self.dropped = 0
        self.rejected = 0
        self.temps_removed = 0
        self.orphans_removed = 0
        self.write_log: list[tuple[str, int, int, float]] = []  # (kind, tokens, bytes, seconds)
        self._retry_at = 0.0
        self.last_error: Optional[str] = None
        self.warnings: list[str] = []
        self._warned: set[str] = set()
        self._unseen = 0
        self.writable = False
        self.enabled = False
        self.read_only_reason: Optional[str] = None

        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self.writable = self._acquire_lock()
            if self.writable:
                self.snap_dir.mkdir(exist_ok=True)
            self.enabled = True
        except OSError as e:
            self.writable = False
            self._warn("open", f"Prompt cache folder {self.root} is not usable ({e.strerror or e}); "
                               "the cache works in memory only this session.")
            self.last_error = str(e)
        if budget_bytes is None:
            budget_bytes = self._default_budget()
        self.budget_bytes = int(budget_bytes)
        if self.enabled:
            self._open_index()
        self._thread: Optional[threading.Thread] = None
        if self.writable:
            self._queue.append(_Task("sync"))  # apply the budget (it may have shrunk) off this thread
            self._thread = threading.Thread(target=self._run, name="verbatim-disk-cache", daemon=True)
            self._thread.start()
            # Best effort on exit without close(): pending writes get a short grace period.
            ref = weakref.ref(self)
            atexit.register(lambda: (c := ref()) is not None and c.close(timeout=10.0))

    # -- DiskTier protocol -------------------------------------------------------------------
    def entries(self, model_key: str) -> list[SnapshotMeta]:
        with self._lock:
            return list(self._by_key.get(model_key, {}).values())

    def load(self, meta: SnapshotMeta) -> Snapshot:
        """Read, verify and rebuild a snapshot (on the calling thread, which owns the arrays)."""
        with self._lock:
            entry = self._entries.get(meta.id)
        if entry is None:
            raise SnapshotError("not in the disk index")
        try:
            snap = self._read(entry)
        except SnapshotError as e:
            self.load_errors += 1
            self.remove(meta.id)
            raise e
        with self._lock:
            if meta.id in self._entries:
                self._entries[meta.id].last_used = time.time()
                self._dirty = True
                self._cond.notify()
        self.loads += 1
        return snap

    def save_async(self, snapshot: Snapshot) -> None:
        """Queue a snapshot for writing; returns at once (no disk I/O on the caller's thread)."""
        if not self.writable:
            return
        if any(c not in CACHE_CLASSES for c in snapshot.meta.classes):
            self.skipped += 1
            return
        with self._lock:
            if self._stop:
                return
            self._queue.append(_Task("save", snapshot, nbytes=snapshot.meta.nbytes))
            self._pending_bytes += snapshot.meta.nbytes
            # A writer far behind must not pin unbounded memory: drop the oldest pending saves.
            while self._pending_bytes > self.max_pending_bytes:
                old = next((t for t in self._queue if t.kind == "save"), None)
                if old is None or old.snapshot is snapshot:
                    break
                self._queue.remove(old)
                self._pending_bytes -= old.nbytes
                self.dropped += 1
            self._cond.notify()

    def remove(self, snapshot_id: str) -> None:
        with self._lock:
            entry = self._entries.pop(snapshot_id, None)
            if entry is None:
                return
            self._by_key.get(entry.meta.model_key, {}).pop(snapshot_id, None)
            if self.writable:
                self._queue.append(_Task("delete", ids=[snapshot_id]))
                self._cond.notify()

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._by_key.clear()
            if self.writable:
                self._queue.append(_Task("clear"))
                self._cond.notify()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "dir": str(self.root),
                "env": self.env,
                "entries": len(self._entries),
                "entries_other_env": sum(1 for e in self._entries.values() if e.env != self.env),
                "bytes": sum(e.file_bytes for e in self._entries.values()),
                "budget_bytes": self.budget_bytes,
                "writable": self.writable,
                "pending": sum(1 for t in self._queue if t.kind == "save") + (1 if self._busy else 0),
                "writes": self.writes,
                "write_errors": self.write_errors,
                "write_seconds": round(self.write_seconds, 4),
                "bytes_written": self.bytes_written,
                "loads": self.loads,
                "load_errors": self.load_errors,
                "evictions": self.evictions,
                "skipped": self.skipped,
                "dropped": self.dropped,
                "rejected_on_open": self.rejected,
                "temps_removed_on_open": self.temps_removed,
                "orphans_removed_on_open": self.orphans_removed,
                "last_error": self.last_error,
                "warnings": list(self.warnings),
            }

    # -- lifecycle -----------------------------------------------------------------------------
    def _settled(self) -> bool:
        """Nothing left for the writer (an index write that keeps failing counts as settled)."""
        index_due = self._dirty and self.writable and time.monotonic() >= self._retry_at
        return not self._queue and not self._busy and not index_due

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until every queued write is on disk; False if `timeout` ran out first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._flushers += 1
            self._cond.notify_all()
            try:
                while not self._settled():
                    if self._thread is None or not self._thread.is_alive():
                        return False
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._cond.wait(0.5 if left is None else min(left, 0.5))
            finally:
                self._flushers -= 1
        return True

    def hold_writes(self) -> None:
        """A generation starts: queued writes wait until `release_writes` (a write already in
        progress finishes). Disk writes then never compete with prefill and decode for the CPU,
        which on 2 cores slowed a regenerate started right after a reply by ~20%."""
        with self._cond:
            self._holds += 1

    def _wait_while_held(self) -> None:
        """Called by the writer between pieces of a write: a generation that started meanwhile
        gets the CPU (and the GIL) back at once; the temp file simply waits to be finished."""
        with self._cond:
            while self._holds > 0 and not self._flushers and not self._stop:
                self._cond.wait(0.1)

    def release_writes(self) -> None:
        with self._cond:
            self._holds = max(0, self._holds - 1)
            self._cond.notify_all()

    def close(self, timeout: Optional[float] = None) -> bool:
        """Flush pending writes, stop the writer, release the folder lock. Idempotent."""
        done = self.flush(timeout)
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None and done:
            self._thread.join(timeout=5.0)
        if self._lock_fd is not None and (self._thread is None or not self._thread.is_alive()):
            try:
                os.close(self._lock_fd)  # closing drops the flock
            except OSError:
                pass
            self._lock_fd = None
        return done

    def pop_warnings(self) -> list[str]:
        """Warnings not yet shown to the user (each problem is reported once)."""
        with self._lock:
            new = self.warnings[len(self.warnings) - self._unseen :] if self._unseen else []
            self._unseen = 0
            return new

    def set_budget(self, budget_bytes: int) -> None:
        with self._lock:
            self.budget_bytes = int(budget_bytes)
            if self.writable:
                self._queue.append(_Task("sync"))
                self._cond.notify()

    # -- open ----------------------------------------------------------------------------------
    def _default_budget(self) -> int:
        try:
            free = shutil.disk_usage(self.root if self.root.exists() else self.root.parent).free
        except OSError:
            free = 0
        return int(min(DEFAULT_MAX_BUDGET, free * DEFAULT_FREE_FRACTION))

    def _acquire_lock(self) -> bool:
        """One writer per folder: a second app instance reads the cache but never changes it."""
        try:
            import fcntl
        except ImportError:  # no flock (Windows): single instance assumed
            return True
        try:
            fd = os.open(self.root / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
            # A read-only folder can still serve what it holds.
            self.read_only_reason = os.strerror(e.errno)
            self.last_error = str(e)
            self._warn("readonly", f"The prompt cache folder {self.root} is not writable ({os.strerror(e.errno)}); "
                                   "new snapshots are kept in memory only this session.")
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            self.read_only_reason = "another Verbatim instance is using this prompt cache"
            self._warn("locked", f"The prompt cache in {self.root} is in use by another instance; "
                                 "this one reads it but does not write to it.")
            return False
        self._lock_fd = fd
        return True

    def _open_index(self) -> None:
        """Load and validate the index, then reconcile it with the files (writer not started)."""
        raw: list[Any] = []
        try:
            if self.index_path.stat().st_size > MAX_INDEX_BYTES:
                raise ValueError("index too large")
            doc = json.loads(self.index_path.read_bytes())
            if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != FORMAT_VERSION:
                raise ValueError("unknown index format")
            raw = doc.get("entries")
            if not isinstance(raw, list):
                raise ValueError("entries is not a list")
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as e:
            self.last_error = f"prompt cache index unreadable, starting empty: {e}"
            self._dirty = True
            raw = []
        for d in raw:
            try:
                e = entry_from_dict(d)
                if e.meta.id in self._entries:
                    raise ValueError("duplicate id")
                p = self.snap_dir / f"{e.meta.id}.safetensors"
                st = p.lstat()
                if not p.is_file() or p.is_symlink():
                    raise ValueError("not a regular file")
                if st.st_size != e.file_bytes:
                    raise ValueError("file size does not match the index")
            except (ValueError, OSError):
                self.rejected += 1
                self._dirty = True
                continue
            self._add(e)
        if self.writable:
            self._reconcile_files()
        if not self.writable:
            self._dirty = False

    def _reconcile_files(self) -> None:
        """Delete temp files (interrupted writes) and snapshot files the index does not list."""
        for folder in (self.snap_dir, self.root):
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            for name in names:
                p = folder / name
                if name.startswith(TMP_PREFIX):
                    _unlink(p)
                    self.temps_removed += 1
                elif folder == self.snap_dir and name.endswith(".safetensors"):
                    if name[: -len(".safetensors")] not in self._entries:
                        _unlink(p)
                        self.orphans_removed += 1

    def _add(self, e: Entry) -> None:
        self._entries[e.meta.id] = e
        if e.env == self.env:  # other environments' entries only count toward the budget
            self._by_key.setdefault(e.meta.model_key, {})[e.meta.id] = e.meta

    def _drop(self, sid: str) -> Optional[Entry]:
        e = self._entries.pop(sid, None)
        if e is not None:
            self._by_key.get(e.meta.model_key, {}).pop(sid, None)
            if not self._by_key.get(e.meta.model_key):
                self._by_key.pop(e.meta.model_key, None)
        return e

    # -- reading -------------------------------------------------------------------------------
    def _read(self, entry: Entry) -> Snapshot:
        meta = entry.meta
        path = self.snap_dir / f"{meta.id}.safetensors"
        try:
            with open(path, "rb") as f:
                data = f.read(entry.file_bytes + 1)
        except FileNotFoundError:
            raise SnapshotError("file missing") from None
        except OSError as e:
            raise SnapshotError(f"cannot read file: {e.strerror or e}") from None
        if len(data) != entry.file_bytes:
            raise SnapshotError(f"file size {len(data)} != {entry.file_bytes} (truncated or replaced)")
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            raise SnapshotError("checksum mismatch")
        try:
            header = read_header(data)
            fmeta, layers = file_meta(header)
            env = header["__metadata__"].get("env")
        except ValueError as e:
            raise SnapshotError(f"bad header: {e}") from None
        if meta_to_dict(fmeta) != meta_to_dict(meta) or env != entry.env or entry.env != self.env:
            raise SnapshotError("file does not match its index entry")
        try:
            tensors, _ = mx.load(io.BytesIO(data), format="safetensors", return_metadata=True)
            cache = []
            for cls_name, node in zip(meta.classes, layers):
                c = CACHE_CLASSES[cls_name].from_state(_decode_state(node, tensors))
                off = layer_offset(c)
                if off is not None and off != meta.length:
                    raise SnapshotError(f"layer offset {off} != snapshot length {meta.length}")
                cache.append(c)
            mx.eval(list(tensors.values()))
        except SnapshotError:
            raise
        except Exception as e:  # MLX raises RuntimeError/ValueError on malformed tensors
            raise SnapshotError(f"cannot rebuild cache: {e}") from None
        return Snapshot(meta, cache, source="disk")

    # -- the writer thread ---------------------------------------------------------------------
    def _next_task(self) -> Optional[_Task]:
        with self._cond:
            while True:
                held = self._holds > 0 and not self._flushers and not self._stop
                if self._queue and not held:
                    task = self._queue.popleft()
                    if task.kind == "save":
                        self._pending_bytes -= task.nbytes
                    break
                index_due = self._dirty and self.writable and not held
                if index_due and time.monotonic() >= self._retry_at:
                    task = _Task("sync")
                    break
                if self._stop:
                    return None
                self._cond.wait(max(0.05, self._retry_at - time.monotonic()) if index_due else None)
            self._busy = True
            return task

    def _run(self) -> None:
        # Writes are never urgent; decode is. On 2 cores this cut the slowdown of a regenerate
        # started while writes are in flight from 1.61x to 1.36x (docs/benchmarks.md, item 4).
        lower_thread_priority(WRITER_NICE)
        while (task := self._next_task()) is not None:
            try:
                if not self.writable:
                    continue  # a read-only folder: drop the work, the memory tier has it all
                if task.kind == "save" and task.snapshot is not None:
                    self._save(task.snapshot)
                elif task.kind == "delete":
                    self._mark_dirty()
                    self._write_index()  # forget first, then delete (see _evict)
                    for sid in task.ids:
                        _unlink(self.snap_dir / f"{sid}.safetensors")
                elif task.kind == "clear":
                    self._clear_files()
                elif task.kind == "sync":
                    self._evict(0)
                with self._lock:
                    write_index = self._dirty and not self._queue and time.monotonic() >= self._retry_at
                if write_index:
                    self._write_index()
            except Exception as e:  # never let the writer die: record, tell once, go on
                self._record_error(e)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _mark_dirty(self) -> None:
        with self._lock:
            self._dirty = True

    def _hook_point(self, point: str) -> None:
        if not self._hook:
            return
        trace = self._hook.get("trace")
        if trace:
            with open(trace, "a") as f:
                f.write(point + "\n")
        delay = (self._hook.get("sleep") or {}).get(point)
        if delay:
            time.sleep(float(delay))

    def _superseded(self, meta: SnapshotMeta) -> bool:
        """True if the disk (or a save queued after this one) already serves every restore it could."""
        with self._lock:
            for other in self._by_key.get(meta.model_key, {}).values():
                if dominates(other, meta):
                    self._entries[other.id].last_used = time.time()
                    self._dirty = True
                    return True
            for t in self._queue:
                if t.kind == "save" and t.snapshot is not None:
                    m = t.snapshot.meta
                    if m.model_key == meta.model_key and dominates(m, meta):
                        return True
        return False

    def _save(self, snap: Snapshot) -> None:
        meta = snap.meta
        if self._superseded(meta) or meta.nbytes > self.budget_bytes:
            self.skipped += 1
            return
        self._evict(meta.nbytes)
        t0 = time.perf_counter()
        self._hook_point("begin")
        tensors: dict[str, mx.array] = {}
        layers = [_encode_state(c.state, str(i), tensors) for i, c in enumerate(snap.cache)]
        header_meta = {
            "format": FORMAT,
            "version": str(FORMAT_VERSION),
            "meta": json.dumps(meta_to_dict(meta), separators=(",", ":")),
            "layers": json.dumps(layers, separators=(",", ":")),
            "env": self.env,
        }
        final = self.snap_dir / f"{meta.id}.safetensors"
        tmp = self.snap_dir / f"{TMP_PREFIX}{meta.id}-{os.getpid()}.safetensors"
        writer: Optional[_HashingWriter] = None
        renamed = False
        try:
            with open(tmp, "wb") as f:

                def on_write(n: int) -> None:
                    if n == 2 and self._hook:  # header written, data not yet: a partial file
                        f.flush()
                        self._hook_point("temp_partial")
                    self._wait_while_held()  # MLX writes one array per call: pause between them

                writer = _HashingWriter(f, on_write)
                mx.save_safetensors(writer, tensors, metadata=header_meta)
                f.flush()
                self._wait_while_held()
                _fsync(f.fileno())
                size = f.tell()
            sha = writer.hash.hexdigest() if writer.linear and writer.pos == size else _file_sha256(tmp)
            self._hook_point("temp_synced")
            now = time.time()
            entry = Entry(meta, size, sha, now, now, self.env)
            # The index lists the entry before the file appears under its final name (module doc);
            # entries() shows it only once the file is there.
            self._write_index(extra=entry)
            self._hook_point("index_written")
            try:
                os.replace(tmp, final)
                renamed = True
            except BaseException:
                self._mark_dirty()  # the index on disk lists a file that is not there
                raise
            _fsync_dir(self.snap_dir)
            self._hook_point("renamed")
        except Exception as e:
            if not renamed:
                _unlink(tmp)
            if writer is not None and writer.error is not None and not isinstance(e, OSError):
                e = writer.error  # the errno MLX wrapped away
            self._record_error(e)
            return
        dt = time.perf_counter() - t0
        with self._lock:
            self._add(entry)
            self.writes += 1
            self.write_seconds += dt
            self.bytes_written += size
            self.write_log.append((meta.kind, meta.length, size, dt))
            del self.write_log[:-64]
            # Drop entries the new one makes redundant (same state, or a trimmable superset).
            redundant = [
                m.id for m in self._by_key.get(meta.model_key, {}).values()
                if m.id != meta.id and dominates(meta, m)
            ]
            for sid in redundant:
                self._drop(sid)
            if redundant:
                self._dirty = True
        if redundant:
            self._write_index()
            for sid in redundant:
                _unlink(self.snap_dir / f"{sid}.safetensors")
        self._evict(0)
        self._hook_point("done")

    def _evict(self, incoming: int) -> None:
        """Drop least recently used entries (any model) until `incoming` more bytes fit."""
        victims: list[str] = []
        with self._lock:
            total = sum(e.file_bytes for e in self._entries.values())
            for e in sorted(self._entries.values(), key=lambda e: e.last_used):
                if total + incoming <= self.budget_bytes:
                    break
                victims.append(e.meta.id)
                total -= e.file_bytes
                self._drop(e.meta.id)
                self.evictions += 1
            if victims:
                self._dirty = True
        if victims:
            # Forget first, then delete: a crash in between leaves unlisted files (removed on
            # open), never an entry whose file is gone.
            self._write_index()
            for sid in victims:
                _unlink(self.snap_dir / f"{sid}.safetensors")

    def _clear_files(self) -> None:
        with self._lock:
            self._entries.clear()
            self._by_key.clear()
            self._dirty = True
        self._write_index()
        for name in os.listdir(self.snap_dir):
            if name.endswith(".safetensors"):
                _unlink(self.snap_dir / name)

    def _write_index(self, extra: Optional[Entry] = None) -> None:
        """Atomically replace index.json with the in-memory index (plus `extra`)."""
        with self._lock:
            rows = [e.to_dict() for e in self._entries.values()]
            self._dirty = False
        if extra is not None:
            rows.append(extra.to_dict())
        doc = {"format": FORMAT, "version": FORMAT_VERSION, "entries": rows}
        blob = json.dumps(doc, separators=(",", ":")).encode()
        tmp = self.root / f"{TMP_PREFIX}index-{os.getpid()}.json"
        try:
            with open(tmp, "wb") as f:
                f.write(blob)
                f.flush()
                _fsync(f.fileno())
            self._hook_point("index_tmp")
            os.replace(tmp, self.index_path)
            _fsync_dir(self.root)
        except BaseException:
            _unlink(tmp)
            with self._lock:
                self._dirty = True
                self._retry_at = time.monotonic() + INDEX_RETRY_S  # no busy loop on a full disk
            raise
        with self._lock:
            self._retry_at = 0.0

    # -- errors --------------------------------------------------------------------------------
    def _record_error(self, e: BaseException) -> None:
        code = getattr(e, "errno", None)
        msg = f"{type(e).__name__}: {e}"
        with self._lock:
            self.write_errors += 1
            self.last_error = msg
            if code in (errno.EROFS, errno.EACCES, errno.EPERM):
                # These do not go away by themselves: stop writing for this session.
                self.writable = False
                self._queue.clear()
                self._pending_bytes = 0
        if code == errno.ENOSPC:
            self._warn("enospc", f"The disk is full: prompt cache snapshots are not being saved to {self.root} "
                                 "(replies are unaffected; the cache works in memory).")
        elif code in (errno.EROFS, errno.EACCES, errno.EPERM):
            self._warn("readonly", f"The prompt cache folder {self.root} is not writable ({os.strerror(code)}); "
                                   "the cache works in memory only this session.")
        else:
            self._warn("write", f"Saving the prompt cache to disk failed ({msg}); replies are unaffected.")

    def _warn(self, kind: str, message: str) -> None:
        with self._lock:
            if kind in self._warned:
                return
            self._warned.add(kind)
            self.warnings.append(message)
            self._unseen += 1
        if self.on_warning is not None:
            try:
                self.on_warning(message)
            except Exception:
                pass


def _unlink(p: Path) -> None:
    try:
        os.unlink(p)
    except FileNotFoundError:
        pass
    except OSError:
        pass  # a read-only folder: the index no longer lists it, which is what matters


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
