"""Blocks: the state of positions [a, b) of every position-indexed layer, named by its history.

Why blocks, and why they end at cuts. Turn N + 1 of a chat restores turn N's state up to the
start of turn N's reply (turn N's prompt but its last token: a reply header cut, planner.py) and
prefills from there: its state up to that point is turn N's, bit for bit. Stored as whole snapshots, every turn writes the whole conversation again. Stored as
blocks, a snapshot is a list of block names (a manifest) and a save writes only the blocks the
store lacks: what the turn added.

Two states of the same tokens are the same bits only if the same forwards computed them
(the width and start of every forward decide the kernels' reductions: planner.py) in the same
compute environment. So a block's name is a hash chain: the previous block's name, the block's
tokens, and every forward that computed a position of it, rooted in the compute environment and
the cache key (model key and namespace: engine/cache/namespace.py). A fast-mode block, a
prefilled one and a decoded one of the same tokens get different names; blocks of two
namespaces never meet.

Blocks end where the schedule cuts the prompt (chunk multiples, message starts, reply header
cuts), at the point a generation restored from, and at the snapshot's end. In exact mode no forward crosses a cut, so
the blocks of turn N before a cut that turn N + 1 shares have the same names in both turns'
manifests: they are stored once. A block boundary that falls inside a forward (fast mode
restores anywhere) is still correct, the forward is part of both blocks' names, only shared
less. A snapshot with no recorded history (`forwards` empty) gets names no other can have.

Which layers are kept in blocks (`in_blocks`, the one definition: memory tier, disk writer,
restore, spare and sizes all ask here): a layer whose cache class stores positions that can be cut
anywhere (`families.Rules.blocks`: KV and quantized KV) *and* that holds positions (`keys` set).
Layers that have no positions, or whose positions cannot be cut (a wrapped sliding window,
SSM and convolution state: families.py), are not in blocks: each snapshot keeps them whole.

How a save's new blocks are packed (`pack_groups`, the one definition: the memory tier's
`MemPack`s and the disk writer's pack files alike): those up to the snapshot's last exact cut
(the prefill, which later turns share) in one pack, those after it (the decoded tail, which a
later turn of the same conversation makes redundant) in another, and never across a change of
the buffer the positions are read from.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Sequence, TypeVar

from engine.cache.families import rules_of
from engine.cache.meta import SnapshotMeta

KEY_CHARS = 40  # hex characters of a block name (160 bits)
_VERSION = b"verbatim-block-v1"

Span = tuple[int, int]
T = TypeVar("T")


def in_blocks(layer: Any) -> bool:
    """Is this layer's state kept as blocks of positions (else as one whole piece)?"""
    return rules_of(layer).blocks and getattr(layer, "keys", None) is not None


def layers_in_blocks(cache: Sequence[Any]) -> list[bool]:
    """`in_blocks` of every layer, in order."""
    return [in_blocks(c) for c in cache]


def pack_groups(new: Sequence[tuple[Span, T]], canonical: int, run_ends: Sequence[int] = ()
                ) -> list[list[tuple[Span, T]]]:
    """The packs a save's new blocks go in (`new`: ((start, end), x) in order, x a block's name
    or its names and sizes): first those ending at or before `canonical` (the last exact cut:
    the prefill), then those after it (the decoded tail); each cut again before a block that
    starts at one of `run_ends` (a pack never crosses a change of the source's buffers). No
    empty group."""
    cuts = set(run_ends)
    out: list[list[tuple[Span, T]]] = []
    for part in ([x for x in new if x[0][1] <= canonical], [x for x in new if x[0][1] > canonical]):
        for i, x in enumerate(part):
            if i == 0 or x[0][0] in cuts:
                out.append([])
            out[-1].append(x)
    return out


def block_bounds(meta: SnapshotMeta) -> list[tuple[int, int]]:
    """The [start, end) of each of `meta`'s blocks, in order, covering [0, length)."""
    n = meta.length
    ends = sorted({e for e in meta.block_ends if 0 < e < n} | {n})
    return list(zip([0, *ends[:-1]], ends))


def forwards_of(forwards: Sequence[tuple[int, int]], a: int, b: int) -> list[tuple[int, int]]:
    """The forwards that computed a position in [a, b)."""
    return [(s, e) for s, e in forwards if s < b and e > a]


def block_keys(meta: SnapshotMeta, env: str) -> list[str]:
    """The name of each of `meta`'s blocks (`block_bounds` order): a hash chain over the compute
    environment, the cache key, and per block its tokens and the forwards that computed it."""
    root = hashlib.sha256(_VERSION)
    root.update(env.encode() + b"\0" + meta.model_key.encode() + b"\0")
    if not meta.forwards:
        root.update(b"unknown history\0" + meta.id.encode())  # never shared
    prev = root.hexdigest()[:KEY_CHARS]
    out = []
    for a, b in block_bounds(meta):
        h = hashlib.sha256(prev.encode())
        h.update(json.dumps([a, b, list(meta.tokens[a:b]), forwards_of(meta.forwards, a, b)],
                            separators=(",", ":")).encode())
        prev = h.hexdigest()[:KEY_CHARS]
        out.append(prev)
    return out


def prefix_meta_fields(meta: SnapshotMeta, n: int) -> dict[str, object]:
    """The history fields of `meta` cut to its first `n` tokens (a restore that keeps n)."""
    return {
        "forwards": tuple(f for f in meta.forwards if f[0] < n),
        "block_ends": tuple(e for e in meta.block_ends if e < n),
        "exact_cuts": tuple(c for c in meta.exact_cuts if c <= n),
    }
