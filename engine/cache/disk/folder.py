"""Opening a cache folder: its lock, an older format's removal, reading and validating the index
file, the stray files an interrupted write leaves, a damaged index moved aside.

All of it runs once when a tier opens (or when a reader re-reads the writer's index, or takes
over): I/O and checks, no state. The result is an `Index` handed to its owner (store.py), which
is the only code that changes it afterwards.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from engine.cache.disk.files import DamagedFile, load_json, read_regular, unlink
from engine.cache.disk.format import FORMAT, FORMAT_VERSION, MAX_INDEX_BYTES, MAX_INDEX_DEPTH
from engine.cache.disk.index import Index
from engine.cache.disk.pack import entry_from_dict, pack_from_dict
from engine.cache.disk.packfiles import PACK_SUFFIX

log = logging.getLogger(__name__)

DAMAGED_NAME = "index.json.damaged"  # the last damaged index, kept for a look (one at most)
LOCK_NAME = ".lock"
DEFAULT_MAX_BUDGET = 10 << 30
DEFAULT_FREE_FRACTION = 0.25


class ReadOnly(Exception):
    """The folder cannot be written (a read-only file system, no permission): `errno` says why."""

    def __init__(self, code: int, error: OSError) -> None:
        super().__init__(os.strerror(code))
        self.errno = code
        self.error = error


def default_budget(root: Path) -> int:
    """A quarter of the free space, at most DEFAULT_MAX_BUDGET."""
    try:
        free = shutil.disk_usage(root if root.exists() else root.parent).free
    except OSError:
        free = 0
    return int(min(DEFAULT_MAX_BUDGET, free * DEFAULT_FREE_FRACTION))


def open_lock(root: Path) -> Optional[int]:
    """One writer per folder: the fd holding the folder's flock, or None if another instance holds
    it (this one then reads the cache but never changes it). -1 where there is no flock
    (Windows: single instance assumed). Raises `ReadOnly` for a folder that cannot be written."""
    try:
        import fcntl  # noqa: F401
    except ImportError:
        return -1
    try:
        fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        raise ReadOnly(e.errno, e) from None  # a read-only folder can still serve what it holds
    return try_lock(root, fd)


def try_lock(root: Path, fd: Optional[int] = None) -> Optional[int]:
    """Take the folder's flock without waiting (`fd`: the lock file, opened here if None); the fd
    holding it, or None."""
    import fcntl

    try:
        if fd is None:
            fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        if fd is not None:
            os.close(fd)
        return None
    return fd


def remove_old_format(index_path: Path, pack_dir: Path) -> bool:
    """A folder written by an older format (2: one file a snapshot) is removed, with one line."""
    version = index_version(index_path)
    if version is None or version == FORMAT_VERSION:
        return False
    if pack_dir.is_dir():
        shutil.rmtree(pack_dir, ignore_errors=True)
    unlink(index_path)
    log.warning("prompt cache %s: removed a cache of format %s (this version writes format %s); "
                "it is rebuilt as you chat", index_path.parent, version, FORMAT_VERSION)
    return True


def move_damaged_aside(root: Path, index_path: Path) -> str:
    """Move a damaged index aside as DAMAGED_NAME (the writer only); what became of it, in words."""
    aside = root / DAMAGED_NAME
    try:
        if aside.is_dir() and not aside.is_symlink():
            shutil.rmtree(aside, ignore_errors=True)
        os.replace(index_path, aside)  # a link, a FIFO or a device node moves as itself
        return f"kept aside as {aside}"
    except OSError as e:
        return f"it could not be moved aside ({e.strerror or e})"


def read_index_doc(index_path: Path) -> Optional[dict[str, Any]]:
    """The index file's JSON object; None if there is no file. Read only if it is a regular file
    (no symlink, FIFO or device) within `MAX_INDEX_BYTES`, nested at most `MAX_INDEX_DEPTH`
    deep: anything else raises `DamagedFile` (the caller treats the folder as damaged)."""
    try:
        data = read_regular(index_path, MAX_INDEX_BYTES)
    except FileNotFoundError:
        return None
    doc = load_json(data, MAX_INDEX_DEPTH)
    if not isinstance(doc, dict):
        raise DamagedFile("it is not a JSON object")
    return doc


def index_version(index_path: Path) -> Optional[int]:
    """The format version an index file says it has (None: no file, damaged, or not ours at all)."""
    try:
        doc = read_index_doc(index_path)
    except (OSError, ValueError):
        return None
    if doc is None or doc.get("format") != FORMAT:
        return None
    v = doc.get("version")
    return v if type(v) is int else None


@dataclass(frozen=True)
class IndexRead:
    """What `read_index` found: the valid manifests and packs, and every loss on the way."""

    index: Index
    rejected: int = 0  # pack rows and manifests dropped
    damage: Optional[str] = None  # why the whole index could not be read (None: it could, or none)
    lost: list[str] = field(default_factory=list)  # one line per dropped pack row or manifest


def read_index(index_path: Path, pack_dir: Path, env: str) -> IndexRead:
    """The index of the valid manifests and their packs, and what was dropped and why. A pack row
    is valid if its file is a regular file with its size; a manifest if it is valid and every pack
    it uses is. Never raises for bad content: a cache starts empty."""
    raw_packs: list[Any] = []
    raw: list[Any] = []
    damage: Optional[str] = None
    lost: list[str] = []
    try:
        doc = read_index_doc(index_path)
        if doc is not None:
            if doc.get("format") != FORMAT or doc.get("version") != FORMAT_VERSION:
                raise DamagedFile("unknown index format")
            raw, raw_packs = doc.get("entries"), doc.get("packs")
            if not isinstance(raw, list) or not isinstance(raw_packs, list):
                raise DamagedFile("entries or packs is not a list")
    except (OSError, ValueError) as e:
        damage = str(e)
        raw, raw_packs = [], []
    index = Index(env)
    for d in raw_packs:
        try:
            row = pack_from_dict(d)
            if row.id in index.packs:
                raise ValueError("duplicate pack")
            p = pack_dir / f"{row.id}{PACK_SUFFIX}"
            try:
                st = p.lstat()
            except FileNotFoundError:
                raise ValueError(f"pack {row.id} is missing") from None
            if not p.is_file() or p.is_symlink():
                raise ValueError(f"pack {row.id} is not a regular file")
            if st.st_size != row.file_bytes:
                raise ValueError(f"pack {row.id} has {st.st_size} bytes, its row says {row.file_bytes} "
                                 "(truncated or replaced)")
        except (ValueError, OSError) as e:
            lost.append(str(e))
            continue
        index.add_pack(row)
    for d in raw:
        try:
            e = entry_from_dict(d)
            if e.meta.id in index:
                raise ValueError(f"snapshot {e.meta.id}: duplicate id")
            if not index.add(e):
                raise ValueError(f"snapshot {e.meta.id}: a block it names is not on disk")
        except ValueError as err:
            lost.append(str(err))
            continue
    return IndexRead(index, len(lost), damage, lost)


def tidy(root: Path, pack_dir: Path, index: Index, tmp_prefix: str) -> tuple[bool, int, int]:
    """A writing instance opens a freshly read `index` (before its owner has it): forget the packs
    no snapshot uses (a crash between a delete and its files), delete the temp files (interrupted
    writes) and the packs it does not list (written, but never named by a committed manifest).
    (whether the index changed, temp files removed, unlisted packs removed)."""
    changed = bool(index.collect())
    temps = orphans = 0
    for path, temp in stray_files(root, pack_dir, index, tmp_prefix):
        unlink(path)
        temps, orphans = (temps + 1, orphans) if temp else (temps, orphans + 1)
    return changed, temps, orphans


def stray_files(root: Path, pack_dir: Path, index: Index, tmp_prefix: str) -> Iterator[tuple[Path, bool]]:
    """(path, is a temp file) for every temp file (an interrupted write) and every pack file the
    index does not list (written, but its manifest never committed)."""
    for folder in (pack_dir, root):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            if name.startswith(tmp_prefix):
                yield folder / name, True
            elif folder == pack_dir and name.endswith(PACK_SUFFIX) and name[: -len(PACK_SUFFIX)] not in index.packs:
                yield folder / name, False
