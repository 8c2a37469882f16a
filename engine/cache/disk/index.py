"""The disk tier's index: what is on disk, per model key, and what to evict or skip.

`index.json` holds every entry's `SnapshotMeta`, file size, sha256 and compute environment.
It is loaded and validated once when the tier opens; afterwards the `Index` object in memory is
the truth and the writer thread writes it back. `Index` is plain bookkeeping with no locking:
`DiskCache` guards it with its own lock.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator, Optional

from engine.cache.disk.format import (
    FORMAT,
    FORMAT_VERSION,
    MAX_INDEX_BYTES,
    Entry,
    entry_from_dict,
)
from engine.cache.planner import SnapshotMeta, dominates


class Index:
    """Entries by id; this compute environment's metas by model key (others only take space)."""

    def __init__(self, env: str) -> None:
        self.env = env
        self._entries: dict[str, Entry] = {}
        self._by_key: dict[str, dict[str, SnapshotMeta]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, sid: str) -> bool:
        return sid in self._entries

    def __iter__(self) -> Iterator[Entry]:
        return iter(list(self._entries.values()))

    def get(self, sid: str) -> Optional[Entry]:
        return self._entries.get(sid)

    def add(self, e: Entry) -> None:
        self._entries[e.meta.id] = e
        if e.env == self.env:  # other environments' entries only count toward the budget
            self._by_key.setdefault(e.meta.model_key, {})[e.meta.id] = e.meta

    def drop(self, sid: str) -> Optional[Entry]:
        e = self._entries.pop(sid, None)
        if e is not None:
            self._by_key.get(e.meta.model_key, {}).pop(sid, None)
            if not self._by_key.get(e.meta.model_key):
                self._by_key.pop(e.meta.model_key, None)
        return e

    def clear(self) -> None:
        self._entries.clear()
        self._by_key.clear()

    def metas(self, model_key: str) -> list[SnapshotMeta]:
        return list(self._by_key.get(model_key, {}).values())

    def total_bytes(self) -> int:
        return sum(e.file_bytes for e in self._entries.values())

    def other_env(self) -> int:
        return sum(1 for e in self._entries.values() if e.env != self.env)

    def dominating(self, meta: SnapshotMeta) -> Optional[Entry]:
        """An entry that serves every restore `meta` could (so `meta` need not be written)."""
        for other in self._by_key.get(meta.model_key, {}).values():
            if dominates(other, meta):
                return self._entries[other.id]
        return None

    def redundant(self, meta: SnapshotMeta) -> list[str]:
        """Ids of the entries `meta` makes redundant (same state, or a trimmable superset)."""
        return [m.id for m in self._by_key.get(meta.model_key, {}).values() if m.id != meta.id and dominates(meta, m)]

    def lru_victims(self, budget: int, incoming: int) -> list[str]:
        """Drop least recently used entries (any model) until `incoming` more bytes fit; their ids."""
        victims: list[str] = []
        total = self.total_bytes()
        for e in sorted(self._entries.values(), key=lambda e: e.last_used):
            if total + incoming <= budget:
                break
            victims.append(e.meta.id)
            total -= e.file_bytes
            self.drop(e.meta.id)
        return victims

    def to_json(self, extra: Optional[Entry] = None) -> bytes:
        rows = [e.to_dict() for e in self._entries.values()]
        if extra is not None:
            rows.append(extra.to_dict())
        doc = {"format": FORMAT, "version": FORMAT_VERSION, "entries": rows}
        return json.dumps(doc, separators=(",", ":")).encode()


def read_index(index_path: Path, snap_dir: Path) -> tuple[list[Entry], int, Optional[str]]:
    """(valid entries whose file is there with its size, rejected entry count, why the whole
    index was unreadable or None). Never raises for bad content: a cache starts empty instead."""
    raw: list[Any] = []
    error = None
    try:
        if index_path.stat().st_size > MAX_INDEX_BYTES:
            raise ValueError("index too large")
        doc = json.loads(index_path.read_bytes())
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != FORMAT_VERSION:
            raise ValueError("unknown index format")
        raw = doc.get("entries")
        if not isinstance(raw, list):
            raise ValueError("entries is not a list")
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as e:
        error = f"prompt cache index unreadable, starting empty: {e}"
        raw = []
    entries: dict[str, Entry] = {}
    rejected = 0
    for d in raw:
        try:
            e = entry_from_dict(d)
            if e.meta.id in entries:
                raise ValueError("duplicate id")
            p = snap_dir / f"{e.meta.id}.safetensors"
            st = p.lstat()
            if not p.is_file() or p.is_symlink():
                raise ValueError("not a regular file")
            if st.st_size != e.file_bytes:
                raise ValueError("file size does not match the index")
        except (ValueError, OSError):
            rejected += 1
            continue
        entries[e.meta.id] = e
    return list(entries.values()), rejected, error


def stray_files(root: Path, snap_dir: Path, index: Index, tmp_prefix: str) -> Iterator[tuple[Path, bool]]:
    """(path, is a temp file) for every temp file (an interrupted write) and every snapshot file
    the index does not list."""
    for folder in (snap_dir, root):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            if name.startswith(tmp_prefix):
                yield folder / name, True
            elif folder == snap_dir and name.endswith(".safetensors") and name[: -len(".safetensors")] not in index:
                yield folder / name, False
