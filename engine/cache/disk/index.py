"""The disk tier's index: the manifests (snapshots) and the packs that hold their blocks.

Pure data: no I/O, no threads, no lock. `index.json` holds every manifest (`Entry`: meta, block
names, whole-piece pack) and every pack row (`PackRow`: span, block names and sizes, file size,
sha256, environment); folder.py reads and validates it once when the tier opens (a manifest is
valid only if every block it names is in a listed pack, and its whole-piece pack is listed).
Afterwards the `Index` in memory is the truth, and it has one owner: the tier's `DiskStore`
(store.py), which changes it on the writer thread only (on a reader instance, which has no
writer, on the engine thread). Everyone else reads an `IndexView`, a frozen copy the owner
publishes after each change: the engine thread never waits for the writer to finish with the
index. Both are `IndexTables`, which holds the tables and every query on them, once.

`Entry` and `PackRow` are frozen: the index and its views share them, and a change (a snapshot
used again: `touch`) replaces the entry in the index, so a view published before it keeps what
it had.

A pack that no manifest uses is garbage: listed or not, it is deleted (after an index that no
longer names it is on disk).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Iterator, Optional

from engine.cache.disk.format import FORMAT, FORMAT_VERSION
from engine.cache.disk.pack import Entry, PackRow
from engine.cache.eviction import EvictionPolicy
from engine.cache.meta import SnapshotMeta
from engine.cache.planner import dominates

BlockLoc = tuple[str, int, int, int]  # where a block is: (pack id, start, end, bytes)


class IndexTables:
    """Manifests by id (and by model key), packs by id, where each block name lives; and the
    queries the index and its views share (see the module doc)."""

    def __init__(self, env: str, entries: dict[str, Entry], by_key: dict[str, dict[str, SnapshotMeta]],
                 packs: dict[str, PackRow], block_locs: dict[str, BlockLoc]) -> None:
        self.env = env
        self._entries = entries
        self._by_key = by_key  # model key -> id -> meta, of this environment's entries only
        self.packs = packs
        self.block_locs = block_locs  # block name -> where it is

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, sid: str) -> bool:
        return sid in self._entries

    def __iter__(self) -> Iterator[Entry]:
        return iter(list(self._entries.values()))

    def get(self, sid: str) -> Optional[Entry]:
        return self._entries.get(sid)

    def model_keys(self) -> list[str]:
        """Every lookup key with entries (a model's own, each of its namespaces')."""
        return [k for k, metas in self._by_key.items() if metas]

    def metas(self, model_key: str) -> list[SnapshotMeta]:
        """The snapshots of `model_key` computed in this environment."""
        return list(self._by_key.get(model_key, {}).values())

    def packs_of(self, e: Entry) -> Optional[set[str]]:
        """The packs `e` uses; None if one of its blocks (or its whole pieces) is not listed."""
        out = set()
        for k in e.block_names:
            loc = self.block_locs.get(k)
            if loc is None:
                return None
            out.add(loc[0])
        if e.whole is not None:
            if e.whole not in self.packs:
                return None
            out.add(e.whole)
        return out

    def users_of_pack(self, pid: str) -> list[str]:
        """The manifests that use pack `pid` (a block in it, or their whole pieces)."""
        return sorted(sid for sid, e in self._entries.items()
                      if e.whole == pid or any(self.block_locs.get(k, ("",))[0] == pid for k in e.block_names))

    def total_bytes(self) -> int:
        """Bytes of the pack files: what the folder holds (each block counted once)."""
        return sum(r.file_bytes for r in self.packs.values())

    def referenced_block_bytes(self) -> int:
        """The bytes every manifest's blocks would take if none were shared."""
        return sum(self.block_locs[k][3] for e in self._entries.values() for k in e.block_names if k in self.block_locs)

    def other_env(self) -> int:
        """Manifests computed in another environment (kept within the budget, never returned)."""
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


class Index(IndexTables):
    """The index its owner changes (store.py): the tables, and who uses each pack."""

    def __init__(self, env: str) -> None:
        super().__init__(env, {}, {}, {}, {})
        self._users: dict[str, set[str]] = {}  # pack id -> ids of the manifests using it

    # -- packs ---------------------------------------------------------------------------------
    def add_pack(self, row: PackRow) -> None:
        self.packs[row.id] = row
        self._users.setdefault(row.id, set())
        for a, b, k, nb in row.spans():
            self.block_locs.setdefault(k, (row.id, a, b, nb))  # the first pack to hold a block keeps it

    def _drop_pack(self, pid: str) -> None:
        row = self.packs.pop(pid, None)
        self._users.pop(pid, None)
        if row is not None:
            for _, _, k, _ in row.spans():
                if self.block_locs.get(k, ("",))[0] == pid:
                    del self.block_locs[k]

    def unused_packs(self) -> list[str]:
        """Packs no manifest uses: free to delete once the index on disk no longer names them."""
        return [pid for pid, users in self._users.items() if not users]

    def collect(self) -> list[str]:
        """Forget the packs no manifest uses; their ids (delete the files after the next index write)."""
        gone = self.unused_packs()
        for pid in gone:
            self._drop_pack(pid)
        return gone

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

    def touch(self, sid: str, at: float) -> bool:
        """Manifest `sid` was used at `at` (time.time()): a new entry replaces it (views published
        before keep the old one). False if it is not listed."""
        e = self._entries.get(sid)
        if e is None:
            return False
        self._entries[sid] = replace(e, last_used=at)
        return True

    def clear(self) -> None:
        self._entries.clear()
        self._by_key.clear()
        self.packs.clear()
        self.block_locs.clear()
        self._users.clear()

    # -- sizes and eviction --------------------------------------------------------------------
    def used_bytes(self, exclude: set[str] = frozenset()) -> int:  # type: ignore[assignment]
        """Bytes of the packs some manifest (not in `exclude`) uses."""
        return sum(r.file_bytes for pid, r in self.packs.items() if self._users.get(pid, set()) - exclude)

    def own_bytes(self, sid: str) -> int:
        """Bytes dropping manifest `sid` would free: its packs that no other manifest uses."""
        return sum(self.packs[pid].file_bytes for pid, users in self._users.items() if users == {sid})

    def victims(self, budget: int, incoming: int, policy: EvictionPolicy) -> list[str]:
        """Forget snapshots (any model) until the packs still used, plus `incoming` bytes, fit
        `budget`; their ids. A shared pack counts once and goes only with its last user. Victims
        come in `policy`'s order (by default least recently used first), taken from the ends of
        chains: the first snapshot that frees something (one whose blocks all serve longer
        snapshots frees nothing: it goes when they have)."""
        victims: list[str] = []
        while self._entries and self.used_bytes() + incoming > budget:
            order = policy.order((e.meta.id, e.meta, e.last_used) for e in self._entries.values())
            sid = next((s for s in order if self.own_bytes(s) > 0), order[0])
            victims.append(sid)
            self.drop(sid)
        return victims

    # -- what others see -----------------------------------------------------------------------
    def view(self, clears: int) -> "IndexView":
        """A frozen copy for readers (`clears`: how many clears the owner has applied). The
        tables are copied; the `Entry` and `PackRow` objects in them, frozen, are shared."""
        return IndexView(self.env, dict(self._entries), {k: dict(v) for k, v in self._by_key.items()},
                         dict(self.packs), dict(self.block_locs), clears)

    def to_json(self) -> bytes:
        doc = {"format": FORMAT, "version": FORMAT_VERSION,
               "packs": [r.to_dict() for r in self.packs.values()],
               "entries": [e.to_dict() for e in self._entries.values()]}
        return json.dumps(doc, separators=(",", ":")).encode()


class IndexView(IndexTables):
    """The index as its owner last published it (`Index.view`): what the engine thread reads
    (`entries()`, `load()`, `stats()`) without a lock and without waiting for the writer. Frozen:
    its attributes cannot be set after it is made, and nothing changes its tables."""

    def __init__(self, env: str, entries: dict[str, Entry], by_key: dict[str, dict[str, SnapshotMeta]],
                 packs: dict[str, PackRow], block_locs: dict[str, BlockLoc], clears: int) -> None:
        super().__init__(env, entries, by_key, packs, block_locs)
        self.clears = clears  # clears the owner had applied when it published this
        self._frozen = True

    @classmethod
    def empty(cls, env: str, clears: int) -> "IndexView":
        return cls(env, {}, {}, {}, {}, clears)

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_frozen", False):
            raise AttributeError(f"an IndexView is frozen (set {name!r} on the Index it copies)")
        super().__setattr__(name, value)
