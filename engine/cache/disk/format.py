"""What the disk tier's files say, and the validation of everything read back from disk.

The encoding of a layer's state (arrays as tensors, the rest as a JSON
tree) and of `SnapshotMeta`, with the sanity limits that every field read back is checked
against before use. The pack files and the index rows that name them are in pack.py.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from dataclasses import dataclass, replace
from typing import Any, Optional

import mlx.core as mx

from engine.cache.env import MAX_ENV_LEN
from engine.cache.families import layer_offset, persisted, rules_named, trimmable
from engine.cache.kinds import SnapshotKind
from engine.cache.meta import SnapshotMeta
from engine.documents.document import MAX_DOCUMENTS  # one limit: what a request may attach is what the disk reads back
from engine.cache.snapshot import Snapshot
from engine.errors import SnapshotError

FORMAT = "verbatim-prompt-cache"
FORMAT_VERSION = 3  # 3: blocks in packs + manifests (2: one file a snapshot, exact_cuts)

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
MAX_INDEX_DEPTH = 64  # the index nests 6 deep; a deeper file is damage, not something to parse
MAX_HEADER_BYTES = 256 << 20
_KINDS = frozenset(SnapshotKind)  # what an entry's "kind" may say (the members are their strings)

def is_snapshot_id(sid: Any) -> bool:
    """Only ids like this ever become file names, so no index content can reach outside the root."""
    return isinstance(sid, str) and bool(_ID_RE.match(sid))


# ---------------------------------------------------------------------------------------------
# Serialisation: cache objects <-> (tensors, JSON structure)


def encode_state(x: Any, path: str, tensors: dict[str, mx.array]) -> Any:
    """A JSON tree for a layer's state; arrays go to `tensors` under their tree path."""
    if isinstance(x, mx.array):
        tensors[path] = x
        return {"a": path}
    if isinstance(x, (list, tuple)):
        tag = "l" if isinstance(x, list) else "t"
        return {tag: [encode_state(v, f"{path}.{i}", tensors) for i, v in enumerate(x)]}
    if x is None or isinstance(x, (bool, int, float, str)):
        return {"v": x}
    raise TypeError(f"unserialisable cache state element: {type(x).__name__}")


def decode_state(node: Any, tensors: dict[str, mx.array], depth: int = 0) -> Any:
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
        items = [decode_state(v, tensors, depth + 1) for v in val]
        return items if tag == "l" else tuple(items)
    if tag == "v":
        if val is not None and not isinstance(val, (bool, int, float, str)):
            raise SnapshotError("bad state scalar")
        return val
    raise SnapshotError("bad state tag")


def _forward_runs(forwards: tuple[tuple[int, int], ...]) -> list[list[int]]:
    """Forwards as runs [start, end, width] of equal-width forwards end to end (decode steps are
    one run of width 1), so a long reply's history stays a few numbers."""
    runs: list[list[int]] = []
    for s, e in forwards:
        if runs and runs[-1][1] == s and runs[-1][2] == e - s:
            runs[-1][1] = e
        else:
            runs.append([s, e, e - s])
    return runs


def _forwards_from_runs(runs: Any) -> tuple[tuple[int, int], ...]:
    if not isinstance(runs, list) or len(runs) > MAX_TOKENS:
        raise ValueError("bad forwards")
    out: list[tuple[int, int]] = []
    for r in runs:
        if not (isinstance(r, list) and len(r) == 3 and all(_is_int(x, 0, MAX_TOKENS) for x in r)):
            raise ValueError("bad forward run")
        s, e, w = r
        if w < 1 or e <= s or (e - s) % w or len(out) + (e - s) // w > MAX_TOKENS:
            raise ValueError("bad forward run")
        out.extend((p, p + w) for p in range(s, e, w))
    return tuple(out)


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
        "forwards": _forward_runs(meta.forwards),
        "block_ends": list(meta.block_ends),
        **({"documents": list(meta.documents)} if meta.documents else {}),
    }


def _is_int(x: Any, lo: int, hi: int) -> bool:
    return type(x) is int and lo <= x <= hi


def meta_from_dict(d: Any) -> SnapshotMeta:
    """Validate untrusted metadata (index entry or file header); raise ValueError if bad."""
    if not isinstance(d, dict):
        raise ValueError("entry is not an object")
    sid = d.get("id")
    if not is_snapshot_id(sid):
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
    kind = d.get("kind")
    if not isinstance(kind, str) or kind not in _KINDS:
        raise ValueError("bad kind")
    cuts = d.get("exact_cuts")
    if not isinstance(cuts, list) or not all(_is_int(c, 1, n) for c in cuts) or cuts != sorted(set(cuts)):
        raise ValueError("bad exact cuts")
    if type(d.get("trimmable")) is not bool:
        raise ValueError("bad trimmable")
    classes = d.get("classes")
    if not isinstance(classes, list) or not 0 < len(classes) <= MAX_LAYERS:
        raise ValueError("bad classes")
    if not all(isinstance(c, str) and persisted(c) for c in classes):
        raise ValueError("unknown cache class")
    if not _is_int(d.get("nbytes"), 0, MAX_FILE_BYTES):
        raise ValueError("bad nbytes")
    forwards = _forwards_from_runs(d.get("forwards"))
    ends = d.get("block_ends")
    if not isinstance(ends, list) or not all(_is_int(e, 1, n) for e in ends) or ends != sorted(set(ends)):
        raise ValueError("bad block ends")
    documents = d.get("documents", [])  # absent before documents were recorded: none named
    if (not isinstance(documents, list) or len(documents) > MAX_DOCUMENTS
            or not all(isinstance(x, str) and _SHA_RE.match(x) for x in documents)):
        raise ValueError("bad documents")
    return SnapshotMeta(
        id=sid,
        model_key=key,
        tokens=tuple(tokens),
        kind=SnapshotKind(kind),
        exact_cuts=tuple(cuts),
        classes=tuple(classes),
        trimmable=d["trimmable"],
        nbytes=d["nbytes"],
        forwards=forwards,
        block_ends=tuple(ends),
        documents=tuple(documents),
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


def checked_trimmable(meta: SnapshotMeta, cache: list[Any]) -> SnapshotMeta:
    """`meta` with `trimmable` re-derived from the rebuilt cache objects.

    The planner decides from the index whether a snapshot may be cut back; a flag that claims
    a wrapped ring or an SSM state can be cut would make it restore a state longer than it says
    (mlx-lm's trim silently does nothing then): never trust it, refuse the snapshot (G5). The
    layers' own rules (engine/cache/families.py) decide.
    """
    derived = trimmable(cache)
    if meta.trimmable and not derived:
        raise SnapshotError("the index says this cache can be cut back, its layers say it cannot")
    return meta if meta.trimmable == derived else replace(meta, trimmable=derived)
