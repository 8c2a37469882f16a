"""What a save writes: the names of a snapshot's blocks and the rows of the packs it adds.

Pure: which layers are kept in blocks and how new blocks split into packs is engine/cache/
blocks.py's one definition (`layers_in_blocks`, `pack_groups`), which the memory tier uses too.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import replace
from typing import Container

from engine.cache.blocks import block_bounds, block_keys, pack_groups
from engine.cache.disk.pack import PackRow
from engine.cache.snapshot import Snapshot, cache_nbytes

_ids = itertools.count(1)


def new_pack_id() -> str:
    """A new pack's id (a file name: format.is_snapshot_id accepts it), never a snapshot's."""
    return f"p{int(time.time() * 1000):x}-{os.getpid():x}-{next(_ids):x}"


def plan_packs(snap: Snapshot, env: str, have: Container[str]) -> tuple[list[str], list[PackRow]]:
    """(the names of the snapshot's blocks, the rows of the packs to write: the blocks not in
    `have` (the block names on disk), from the first missing one to the end, and its whole
    pieces; none: nothing new). The new blocks go in `pack_groups`' packs: up to the last exact
    cut (the prefill, which later turns share) and after it (decoded tokens, which a later snapshot
    of the same conversation makes redundant: store.py's `trim_tails` frees them)."""
    meta = snap.meta
    blocked = snap.layers_in_blocks()
    names = block_keys(meta, env) if any(blocked) else []
    bounds = block_bounds(meta) if names else []
    n_have = 0
    while n_have < len(names) and names[n_have] in have:
        n_have += 1
    new = list(zip(bounds[n_have:], names[n_have:]))
    whole = meta.id if not all(blocked) else None
    per_pos = snap.position_bytes()
    rows = [PackRow(new_pack_id(), env, meta.model_key, group[0][0][0], group[-1][0][1],
                    [(b, k, (b - a) * per_pos) for (a, b), k in group], None, 0, "")
            for group in pack_groups(new, meta.canonical, snap.run_ends())]
    if whole is not None:
        if rows:
            rows[-1] = replace(rows[-1], whole=whole)
        else:
            rows.append(PackRow(new_pack_id(), env, meta.model_key, meta.length, meta.length, [], whole, 0, ""))
    return names, rows


def incoming_bytes(snap: Snapshot, rows: list[PackRow]) -> int:
    """What the packs `rows` will add to the folder: their blocks, and the whole layers if one of
    them holds the snapshot's whole pieces (eviction makes room for both before the write)."""
    blocks = sum(nb for r in rows for _, _, nb in r.block_rows)
    if not any(r.whole for r in rows):
        return blocks
    return blocks + cache_nbytes([c for c, b in zip(snap.cache, snap.layers_in_blocks()) if not b])
