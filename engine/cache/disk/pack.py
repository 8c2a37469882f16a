"""Pack files and manifests: how the disk tier stores snapshots as shared blocks.

A save writes one pack (``snapshots/<id>.safetensors``): the positions [start, end) of every layer
kept in blocks (the blocks the disk lacked: engine/cache/blocks.py), and, for layers kept whole
(families.py), the whole state of the one snapshot saved. The pack's header names its blocks
(end and name of each) and whose whole pieces it holds. A snapshot on disk is a manifest
(`Entry`): its meta, the names of its blocks in order, and the pack holding its whole pieces.

Every pack is checked before use: size and sha256 of the file against its index row, then the
header (format, version, environment, the blocks it claims), then each layer's positions. A pack
that fails makes exactly the snapshots that use one of its blocks (or its whole pieces) unusable.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import io
import json
import re
import threading
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional, Sequence

import mlx.core as mx

from engine.cache.families import layer_offset, rules_named, rules_of
from engine.cache.disk.format import (
    FORMAT,
    FORMAT_VERSION,
    MAX_ENV_LEN,
    MAX_FILE_BYTES,
    MAX_TOKENS,
    _is_int,
    decode_state,
    encode_state,
    is_snapshot_id,
    meta_from_dict,
    meta_to_dict,
    read_header,
)
from engine.cache.meta import SnapshotMeta
from engine.cache.block_state import MemBlock, MemPack, block_arrays, state_nbytes
from engine.cache.blocks import block_bounds
from engine.cache.snapshot import Snapshot, cache_arrays, sliced
from engine.errors import SnapshotError

_BLOCK_KEY_RE = re.compile(r"^[0-9a-f]{40}$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")


def _times_ok(times: Sequence[Any]) -> bool:
    return all(isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t < 1e11 for t in times)


def _env_ok(env: Any) -> bool:
    return isinstance(env, str) and len(env) <= MAX_ENV_LEN


@dataclass(frozen=True)
class PackRow:
    """The index row of one pack file (frozen: the index and its views share it)."""

    id: str
    env: str
    model_key: str
    start: int
    end: int
    block_rows: list[tuple[int, str, int]]  # (end, name, bytes) of each block; the first starts at `start`
    whole: Optional[str]  # the snapshot whose whole pieces it holds (None: blocks only)
    file_bytes: int
    sha256: str

    def header_dict(self) -> dict[str, Any]:
        """What the pack's own header repeats (so a swapped file is caught)."""
        return {"id": self.id, "env": self.env, "model_key": self.model_key, "start": self.start,
                "end": self.end, "blocks": [[e, k] for e, k, _ in self.block_rows], "whole": self.whole}

    def to_dict(self) -> dict[str, Any]:
        return {**self.header_dict(), "blocks": [list(b) for b in self.block_rows],
                "file_bytes": self.file_bytes, "sha256": self.sha256}

    def spans(self) -> list[tuple[int, int, str, int]]:
        """(start, end, name, bytes) of each block."""
        out, pos = [], self.start
        for e, k, nb in self.block_rows:
            out.append((pos, e, k, nb))
            pos = e
        return out


def pack_from_dict(d: Any) -> PackRow:
    if not isinstance(d, dict) or not is_snapshot_id(d.get("id")):
        raise ValueError("bad pack id")
    start, end = d.get("start"), d.get("end")
    if not (_is_int(start, 0, MAX_TOKENS) and _is_int(end, 0, MAX_TOKENS) and start <= end):
        raise ValueError("bad pack span")
    blocks = d.get("blocks")
    if not isinstance(blocks, list) or len(blocks) > MAX_TOKENS:
        raise ValueError("bad pack blocks")
    rows, pos = [], start
    for b in blocks:
        if not (isinstance(b, list) and len(b) == 3 and _is_int(b[0], pos + 1, end)
                and isinstance(b[1], str) and _BLOCK_KEY_RE.match(b[1]) and _is_int(b[2], 0, MAX_FILE_BYTES)):
            raise ValueError("bad pack block")
        rows.append((b[0], b[1], b[2]))
        pos = b[0]
    if pos != end:
        raise ValueError("pack blocks do not cover its span")
    whole = d.get("whole")
    if whole is not None and not is_snapshot_id(whole):
        raise ValueError("bad pack owner")
    key, env = d.get("model_key"), d.get("env")
    if not isinstance(key, str) or len(key) > 128 or not _env_ok(env):
        raise ValueError("bad pack key or environment")
    fb, sha = d.get("file_bytes"), d.get("sha256")
    if not _is_int(fb, 1, MAX_FILE_BYTES) or not isinstance(sha, str) or not _SHA_RE.match(sha):
        raise ValueError("bad pack size or checksum")
    return PackRow(d["id"], env, key, start, end, rows, whole, fb, sha)


@dataclass(frozen=True)
class Entry:
    """A snapshot on disk: its manifest (frozen: the index and its views share it)."""

    meta: SnapshotMeta
    env: str  # compute_env() of the process that computed it
    block_names: list[str]  # names of its blocks in order, covering [0, length) (none if no layer is in blocks)
    whole: Optional[str]  # the pack holding its whole pieces (None: every layer is in blocks)
    created: float
    last_used: float

    def to_dict(self) -> dict[str, Any]:
        return {**meta_to_dict(self.meta), "env": self.env, "blocks": list(self.block_names), "whole": self.whole,
                "created": self.created, "last_used": self.last_used}


def entry_from_dict(d: Any) -> Entry:
    meta = meta_from_dict(d)
    blocks = d.get("blocks")
    if not isinstance(blocks, list) or len(blocks) > meta.length:
        raise ValueError("bad block list")
    if not all(isinstance(k, str) and _BLOCK_KEY_RE.match(k) for k in blocks):
        raise ValueError("bad block name")
    whole = d.get("whole")
    if whole is not None and not is_snapshot_id(whole):
        raise ValueError("bad whole-piece pack")
    if not _env_ok(d.get("env")):
        raise ValueError("bad environment")
    times = [d.get("created", 0.0), d.get("last_used", 0.0)]
    if not _times_ok(times):
        raise ValueError("bad timestamps")
    return Entry(meta, d["env"], list(blocks), whole, float(times[0]), float(times[1]))


# ---------------------------------------------------------------------------------------------
# Pack files


def encode_pack(snap: Snapshot, row: PackRow) -> tuple[dict[str, mx.array], dict[str, str]]:
    """(tensors, safetensors metadata) of the pack `row` describes, cut from `snap`'s cache."""
    tensors: dict[str, mx.array] = {}
    layers: dict[str, Any] = {}
    for i, (c, blocked) in enumerate(zip(snap.cache, snap.layers_in_blocks())):
        if blocked and row.end > row.start:
            layers[str(i)] = encode_state(snap.span_state(i, row.start, row.end), f"b{i}", tensors)
        elif not blocked and row.whole is not None:
            layers[str(i)] = encode_state(c.state, f"w{i}", tensors)
    metadata = {
        "format": FORMAT,
        "version": str(FORMAT_VERSION),
        "pack": json.dumps(row.header_dict(), separators=(",", ":")),
        "layers": json.dumps(layers, separators=(",", ":")),
    }
    return tensors, metadata


@dataclass
class LoadedPack:
    row: PackRow
    layers: dict[int, Any]  # layer index -> its state (positions [row.start, row.end) or whole)


def decode_pack(data: bytes, row: PackRow, env: str) -> LoadedPack:
    """Check a pack file's bytes against its index row and read its layers' states."""
    if len(data) != row.file_bytes:
        raise SnapshotError(f"pack {row.id}: size {len(data)} != {row.file_bytes} (truncated or replaced)")
    # The checksum runs on another core while the header is checked and the tensors are read
    # (hashlib lets go of the GIL); nothing read is used unless it matches.
    digest = concurrent.futures.Future()  # type: concurrent.futures.Future[str]
    threading.Thread(target=lambda: digest.set_result(hashlib.sha256(data).hexdigest()),
                     name="verbatim-pack-sha", daemon=True).start()
    error: Optional[SnapshotError] = None
    try:
        loaded = _decode_checked(data, row, env)
    except SnapshotError as e:  # a damaged file says so by its checksum first, as before
        error = e
    if digest.result() != row.sha256:  # always waited for: the thread reads `data`
        raise SnapshotError(f"pack {row.id}: checksum mismatch")
    if error is not None:
        raise error
    return loaded


def _decode_checked(data: bytes, row: PackRow, env: str) -> LoadedPack:
    """decode_pack's checks of the header against the row, then its tensors."""
    try:
        md = read_header(data).get("__metadata__")
        if not isinstance(md, dict) or md.get("format") != FORMAT or md.get("version") != str(FORMAT_VERSION):
            raise ValueError("not a Verbatim pack of this version")
        if json.loads(md.get("pack", "null")) != row.header_dict():
            raise ValueError("the pack does not match its index row")
        layers = json.loads(md.get("layers", "null"))
        if not isinstance(layers, dict) or len(layers) > 4096:
            raise ValueError("bad layer table")
    except ValueError as e:
        raise SnapshotError(f"pack {row.id}: bad header: {e}") from None
    if row.env != env:
        raise SnapshotError(f"pack {row.id}: computed in another environment")
    try:
        tensors = mx.load(io.BytesIO(data), format="safetensors")
        out = {int(i): decode_state(node, tensors) for i, node in layers.items() if str(i).isdigit()}
    except SnapshotError:
        raise
    except Exception as e:  # MLX raises RuntimeError/ValueError on malformed tensors
        raise SnapshotError(f"pack {row.id}: cannot read tensors: {e}") from None
    return LoadedPack(row, out)


def _check_parts(parts: list[Any], n: int) -> None:
    """One layer's pieces in position order agree in structure, shape and dtype and add up to
    `n` positions (what a join would need; nothing is joined here)."""
    first = parts[0]
    if isinstance(first, mx.array):
        if any(not isinstance(p, mx.array) or p.shape[:-2] != first.shape[:-2] or p.shape[-1] != first.shape[-1]
               or p.dtype != first.dtype for p in parts):
            raise SnapshotError("blocks of a layer disagree in shape or dtype")
        if sum(p.shape[-2] for p in parts) != n:
            raise SnapshotError("blocks of a layer do not add up to the snapshot's length")
    elif isinstance(first, (list, tuple)):
        if any(not isinstance(p, type(first)) or len(p) != len(first) for p in parts):
            raise SnapshotError("blocks of a layer disagree in structure")
        for i in range(len(first)):
            _check_parts([p[i] for p in parts], n)


class Assembled(NamedTuple):
    """A snapshot's state rebuilt from its packs (what `SharedSnapshot` is made of), and its bytes."""

    cache: list[Any]
    blocks: list[MemBlock]
    blocked: list[bool]
    nbytes: int


def assemble(meta: SnapshotMeta, pieces: list[tuple[LoadedPack, int, int]], whole: Optional[LoadedPack],
             names: Sequence[str]) -> Assembled:
    """The state of snapshot `meta` from the pieces [a, b) of packs covering [0, length) in order
    (layers kept in blocks: each piece becomes a `MemPack` of views of the pack's arrays, its
    blocks named `names`; nothing is joined, the memory tier's restore joins once) and the pack
    of its whole pieces (the other layers, rebuilt)."""
    n = meta.length
    pos = 0
    for _, a, b in pieces:
        if a != pos:
            raise SnapshotError("blocks do not follow each other")
        pos = b
    cache: list[Any] = []
    spans: list[list[Any]] = [[] for _ in pieces]  # per piece, per layer: (keys, values) or None
    blocked: list[bool] = []
    for i, name in enumerate(meta.classes):
        rules = rules_named(name)
        assert rules is not None  # meta_from_dict accepted only persisted classes
        # A block class's layer the writer kept whole (no keys: engine/cache/blocks.py, in_blocks) is not
        # read back as such: it fails below ("lacks layer") and the snapshot is declined, never
        # restored wrong. (It holds no position, so its snapshot could not be restored anyway.)
        blocked.append(rules.blocks)
        if blocked[-1]:
            if pos != n:
                raise SnapshotError(f"blocks cover {pos} of {n} positions")
            parts = []
            for lp, a, b in pieces:
                st = lp.layers.get(i)
                if st is None:
                    raise SnapshotError(f"pack {lp.row.id} lacks layer {i}")
                parts.append(sliced(st, a - lp.row.start, b - lp.row.start))
            if not (isinstance(parts[0], tuple) and len(parts[0]) >= 3):
                raise SnapshotError(f"layer {i}: not a KV state")
            _check_parts([p[:2] for p in parts], n)
            c = rules.restore((*parts[0][:2], n, *parts[0][3:]))  # mlx-lm KV states: (keys, values, offset, ...)
            c.keys = c.values = None  # a template: the positions stay in the packs
            c.offset = n
            for span, p in zip(spans, parts):
                span.append((p[0], p[1]))
        else:
            if whole is None or i not in whole.layers:
                raise SnapshotError(f"layer {i}'s whole state is missing")
            c = rules.restore(whole.layers[i])
            for span in spans:
                span.append(None)
        off = layer_offset(c)
        if off is not None and off != n:
            raise SnapshotError(f"layer offset {off} != snapshot length {n}")
        cache.append(c)
    packs = [MemPack(a, b, span, sum(state_nbytes(kv) for kv in span if kv is not None))
             for (_, a, b), span in zip(pieces, spans)]
    blocks: list[MemBlock] = []
    if any(blocked):
        bounds = block_bounds(meta)
        if len(names) < len(bounds):
            raise SnapshotError("fewer block names than blocks")
        j = 0
        for (s, e), key in zip(bounds, names):
            while j < len(packs) and packs[j].end <= s:
                j += 1
            if j == len(packs) or not packs[j].start <= s < e <= packs[j].end:
                raise SnapshotError("a block lies across two packs")
            blocks.append(MemBlock(key, packs[j], s, e))
    arrays = [a for p in packs for kv in p.layers if kv is not None for a in block_arrays(kv)]
    whole_arrays = cache_arrays([c for c, b in zip(cache, blocked) if not b])
    try:
        mx.eval(arrays + whole_arrays)
    except Exception as e:
        raise SnapshotError(f"cannot rebuild cache: {e}") from None
    nbytes = sum(p.nbytes for p in packs) + sum(a.nbytes for a in whole_arrays)
    return Assembled(cache, blocks, blocked, nbytes)
