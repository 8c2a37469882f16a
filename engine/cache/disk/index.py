"""The disk tier's index: the manifests (snapshots) and the packs that hold their blocks.

`index.json` holds every manifest (`Entry`: meta, block names, whole-piece pack) and every pack
row (`PackRow`: span, block names and sizes, file size, sha256, environment). It is loaded and
validated once when the tier opens; afterwards the `Index` object in memory is the truth and the
writer thread writes it back. A manifest is valid only if every block it names is in a listed
pack (and its whole-piece pack is listed): `read_index` drops the others. A pack that no manifest
uses is garbage: listed or not, it is deleted (after an index that no longer names it is on disk).
`Index` is plain bookkeeping with no locking: `DiskCache` guards it with its own lock.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from engine.cache.disk.files import DamagedFile, load_json, read_regular
from engine.cache.disk.format import FORMAT, FORMAT_VERSION, MAX_INDEX_BYTES, MAX_INDEX_DEPTH
from engine.cache.disk.pack import Entry, PackRow, entry_from_dict, pack_from_dict
from engine.cache.planner import SnapshotMeta, dominates

PACK_SUFFIX = ".safetensors"


class Index:
    """Manifests by id, packs by id, where each block name lives, and who uses each pack."""

    def __init__(self, env: str) -> None:
        self.env = env
        self._entries: dict[str, Entry] = {}
        self._by_key: dict[str, dict[str, SnapshotMeta]] = {}
        self.packs: dict[str, PackRow] = {}
        self.blocks: dict[str, tuple[str, int, int, int]] = {}  # name -> (pack id, start, end, bytes)
        self._users: dict[str, set[str]] = {}  # pack id -> ids of the manifests using it

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, sid: str) -> bool:
        return sid in self._entries

    def __iter__(self) -> Iterator[Entry]:
        return iter(list(self._entries.values()))

    def get(self, sid: str) -> Optional[Entry]:
        return self._entries.get(sid)

    # -- packs ---------------------------------------------------------------------------------
    def add_pack(self, row: PackRow) -> None:
        self.packs[row.id] = row
        self._users.setdefault(row.id, set())
        for a, b, k, nb in row.spans():
            self.blocks.setdefault(k, (row.id, a, b, nb))  # the first pack to hold a block keeps it

    def _drop_pack(self, pid: str) -> None:
        row = self.packs.pop(pid, None)
        self._users.pop(pid, None)
        if row is not None:
            for _, _, k, _ in row.spans():
                if self.blocks.get(k, ("",))[0] == pid:
                    del self.blocks[k]

    def packs_of(self, e: Entry) -> Optional[set[str]]:
        """The packs `e` uses; None if one of its blocks (or its whole pieces) is not listed."""
        out = set()
        for k in e.blocks:
            loc = self.blocks.get(k)
            if loc is None:
                return None
            out.add(loc[0])
        if e.whole is not None:
            if e.whole not in self.packs:
                return None
            out.add(e.whole)
        return out

    def unused_packs(self) -> list[str]:
        """Packs no manifest uses: free to delete once the index on disk no longer names them."""
        return [pid for pid, users in self._users.items() if not users]

    def collect(self) -> list[str]:
        """Forget the packs no manifest uses; their ids (delete the files after the next index write)."""
        gone = self.unused_packs()
        for pid in gone:
            self._drop_pack(pid)
        return gone

    def users_of_pack(self, pid: str) -> list[str]:
        return sorted(self._users.get(pid, ()))

    # -- manifests -----------------------------------------------------------------------------
    def add(self, e: Entry) -> bool:
        """Add a manifest whose blocks are all listed; False (not added) otherwise."""
        packs = self.packs_of(e)
        if packs is None:
            return False
        self._entries[e.meta.id] = e
        for pid in packs:
            self._users[pid].add(e.meta.id)
        if e.env == self.env:  # other environments' entries only count toward the budget
            self._by_key.setdefault(e.meta.model_key, {})[e.meta.id] = e.meta
        return True

    def drop(self, sid: str) -> Optional[Entry]:
        """Forget a manifest (its packs stay until `collect`)."""
        e = self._entries.pop(sid, None)
        if e is not None:
            for users in self._users.values():
                users.discard(sid)
            self._by_key.get(e.meta.model_key, {}).pop(sid, None)
            if not self._by_key.get(e.meta.model_key):
                self._by_key.pop(e.meta.model_key, None)
        return e

    def clear(self) -> None:
        self._entries.clear()
        self._by_key.clear()
        self.packs.clear()
        self.blocks.clear()
        self._users.clear()

    def metas(self, model_key: str) -> list[SnapshotMeta]:
        return list(self._by_key.get(model_key, {}).values())

    # -- sizes ---------------------------------------------------------------------------------
    def total_bytes(self) -> int:
        """Bytes of the pack files: what the folder holds (each block counted once)."""
        return sum(r.file_bytes for r in self.packs.values())

    def used_bytes(self, exclude: set[str] = frozenset()) -> int:  # type: ignore[assignment]
        """Bytes of the packs some manifest (not in `exclude`) uses."""
        return sum(r.file_bytes for pid, r in self.packs.items() if self._users.get(pid, set()) - exclude)

    def referenced_block_bytes(self) -> int:
        """The bytes every manifest's blocks would take if none were shared."""
        return sum(self.blocks[k][3] for e in self._entries.values() for k in e.blocks if k in self.blocks)

    def other_env(self) -> int:
        return sum(1 for e in self._entries.values() if e.env != self.env)

    # -- what to skip, drop or evict -----------------------------------------------------------
    def dominating(self, meta: SnapshotMeta) -> Optional[Entry]:
        """An entry that serves every restore `meta` could (so `meta` need not be written)."""
        for other in self._by_key.get(meta.model_key, {}).values():
            if dominates(other, meta):
                return self._entries[other.id]
        return None

    def redundant(self, meta: SnapshotMeta) -> list[str]:
        """Ids of the entries `meta` makes redundant (same state, or a trimmable superset)."""
        return [m.id for m in self._by_key.get(meta.model_key, {}).values() if m.id != meta.id and dominates(meta, m)]

    def own_bytes(self, sid: str) -> int:
        """Bytes dropping manifest `sid` would free: its packs that no other manifest uses."""
        return sum(self.packs[pid].file_bytes for pid, users in self._users.items() if users == {sid})

    def lru_victims(self, budget: int, incoming: int) -> list[str]:
        """Forget snapshots (any model) until the packs still used, plus `incoming` bytes, fit
        `budget`; their ids. A shared pack counts once and goes only with its last user. Victims
        are taken from the ends of chains: the least recently used snapshot that frees something
        (one whose blocks all serve longer snapshots frees nothing: it goes when they have)."""
        victims: list[str] = []
        while self._entries and self.used_bytes() + incoming > budget:
            order = sorted(self._entries.values(), key=lambda e: e.last_used)
            e = next((e for e in order if self.own_bytes(e.meta.id) > 0), order[0])
            victims.append(e.meta.id)
            self.drop(e.meta.id)
        return victims

    def to_json(self) -> bytes:
        doc = {"format": FORMAT, "version": FORMAT_VERSION,
               "packs": [r.to_dict() for r in self.packs.values()],
               "entries": [e.to_dict() for e in self._entries.values()]}
        return json.dumps(doc, separators=(",", ":")).encode()


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


@dataclass
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
    out = IndexRead(Index(env))
    try:
        doc = read_index_doc(index_path)
        if doc is not None:
            if doc.get("format") != FORMAT or doc.get("version") != FORMAT_VERSION:
                raise DamagedFile("unknown index format")
            raw, raw_packs = doc.get("entries"), doc.get("packs")
            if not isinstance(raw, list) or not isinstance(raw_packs, list):
                raise DamagedFile("entries or packs is not a list")
    except (OSError, ValueError) as e:
        out.damage = str(e)
        raw, raw_packs = [], []
    index = out.index
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
            out.rejected += 1
            out.lost.append(str(e))
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
            out.rejected += 1
            out.lost.append(str(err))
            continue
    return out


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
