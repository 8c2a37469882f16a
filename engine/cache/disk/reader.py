"""Reading a snapshot back from disk: its manifest's packs, checked, then its cache objects.

Runs on the engine thread (the caller owns the arrays it builds), from an `IndexView`: no lock,
and the writer goes on meanwhile. Nothing partial is ever restored: every pack a snapshot uses is
read once and checked against its row before any cache object is built.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Optional

from engine.cache.block_state import SharedSnapshot
from engine.cache.blocks import block_keys, prefix_meta_fields
from engine.cache.disk.format import checked_trimmable
from engine.cache.disk.index import IndexView
from engine.cache.disk.pack import Entry, LoadedPack, PackRow, assemble
from engine.cache.disk.packfiles import BadPack, PackFiles, PackMissing
from engine.cache.kinds import SnapshotKind
from engine.cache.snapshot import new_snapshot_id
from engine.errors import SnapshotError


def read_snapshot(entry: Entry, view: IndexView, files: PackFiles, writable: bool,
                  on_bad_pack: Callable[[str], None], upto: Optional[int] = None) -> SharedSnapshot:
    """Read, verify and rebuild `entry`'s snapshot. A pack that fails its checks is reported to
    `on_bad_pack` (every snapshot using it is unusable) and raises. A reader (`writable` False)
    that finds a pack gone (`PackMissing`) gets the longest prefix whose blocks are still there,
    if its layers allow cutting it. `upto`: read a snapshot that can be cut only up to the first block end at
    or past it, as a shorter snapshot of a new id (the one on disk stays whole)."""
    meta = entry.meta
    env = view.env
    if entry.env != env:
        raise SnapshotError("computed in another environment")
    if entry.block_names and block_keys(meta, env) != entry.block_names:
        # Block names hash the tokens, the history and the key: an edited manifest shows.
        raise SnapshotError("the blocks do not match its index entry (tokens, history or key changed)")

    def read(row: PackRow) -> LoadedPack:
        try:
            return files.read(row, env)
        except BadPack:
            on_bad_pack(row.id)
            raise

    loaded: dict[str, LoadedPack] = {}
    pieces: list[tuple[LoadedPack, int, int]] = []
    gone: Optional[PackMissing] = None
    short = upto is not None and entry.whole is None and meta.trimmable and upto < meta.length
    for k in entry.block_names:
        loc = view.block_locs.get(k)
        if loc is None:
            raise SnapshotError(f"block {k} is not on disk")
        pid, a, b, _ = loc
        if short and upto is not None and a >= upto:
            break  # the rest is past what the caller restores
        if pid not in loaded:
            row = view.packs.get(pid)
            try:
                if row is None:  # the writer collected it meanwhile
                    raise PackMissing(f"pack {pid} missing")
                loaded[pid] = read(row)
            except PackMissing as e:
                if writable:
                    raise
                gone = e  # a reader: the writer instance took it away; keep the prefix
                break
        if pieces and pieces[-1][0] is loaded[pid] and pieces[-1][2] == a:
            pieces[-1] = (loaded[pid], pieces[-1][1], b)  # one slice per pack run
        else:
            pieces.append((loaded[pid], a, b))
    whole = None
    if gone is None and entry.whole is not None:
        row = view.packs.get(entry.whole)
        if row is None:
            raise SnapshotError("its whole-state pack is not on disk")
        whole = loaded.get(row.id) or read(row)
    if gone is not None:
        n = pieces[-1][2] if pieces else 0
        if n == 0 or entry.whole is not None or not meta.trimmable:
            raise gone
        meta = replace(meta, tokens=meta.tokens[:n], kind=SnapshotKind.PARTIAL, **prefix_meta_fields(meta, n))
    elif short and pieces and pieces[-1][2] < meta.length:
        n = pieces[-1][2]
        meta = replace(meta, id=new_snapshot_id(), tokens=meta.tokens[:n], kind=SnapshotKind.PARTIAL,
                       nbytes=meta.nbytes * n // meta.length, **prefix_meta_fields(meta, n))
    try:
        state = assemble(meta, pieces, whole, entry.block_names)
    except SnapshotError as e:
        raise SnapshotError(f"cannot rebuild from its blocks: {e}") from None
    if gone is not None:
        meta = replace(meta, nbytes=state.nbytes)
    elif state.nbytes != meta.nbytes:
        raise SnapshotError(f"its state holds {state.nbytes} bytes, its index entry says {meta.nbytes}: "
                            "the file does not match its index entry")
    return SharedSnapshot(checked_trimmable(meta, state.cache), state.cache, state.blocks, state.blocked)
