"""Which layers of a cache are kept in blocks: the one definition (memory tier, disk writer,
restore, spare, sizes all ask here).

A layer is kept in blocks when its cache class stores positions that can be cut anywhere
(`families.Rules.blocks`: KV and quantized KV) *and* it holds positions (`keys` set). A KV layer
with `keys=None` (nothing forwarded into it) is kept whole, by both tiers alike.
"""

from __future__ import annotations

from typing import Any, Sequence

from engine.cache.families import rules_of


def in_blocks(layer: Any) -> bool:
    """Is this layer's state kept as blocks of positions (else as one whole piece)?"""
    return rules_of(layer).blocks and getattr(layer, "keys", None) is not None


def layers_in_blocks(cache: Sequence[Any]) -> list[bool]:
    """`in_blocks` of every layer, in order."""
    return [in_blocks(c) for c in cache]
