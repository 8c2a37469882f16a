"""The snapshot file format and the validation of everything read back from disk.

One snapshot is one safetensors file: each layer's state arrays as tensors, the rest of the
state (its tree structure and scalars) as JSON in the safetensors metadata, together with the
snapshot's `SnapshotMeta` and the compute environment that produced it. Nothing read from disk
(index entry or file header) is trusted: every field is checked against sanity limits before
use, and a snapshot is rebuilt only from bytes whose checksum and header match its index entry.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from dataclasses import dataclass, replace
from typing import Any, Optional

import mlx.core as mx

from engine.blas import blas_library
from engine.cache.families import layer_offset, persisted, rules_named, trimmable
from engine.cache.planner import SnapshotMeta
from engine.cache.snapshot import Snapshot
from engine.errors import SnapshotError

FORMAT = "verbatim-prompt-cache"
FORMAT_VERSION = 2  # 2: exact_cuts replaces canonical / prefill_end / prefill_exact

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
MAX_HEADER_BYTES = 256 << 20
KINDS = ("pre-last", "end", "boundary", "partial")
MAX_ENV_LEN = 1024

_ENV: Optional[str] = None


def compute_env() -> str:
    """What, besides the model key, decides the bits of a forward: versions, device, BLAS."""
    global _ENV
    if _ENV is None:
        import platform

        import mlx_lm

        _ENV = (f"mlx {mx.__version__}; mlx-lm {mlx_lm.__version__}; {mx.default_device()}; "
                f"{platform.system()} {platform.machine()}; blas {blas_library()}")[:MAX_ENV_LEN]
    return _ENV


def is_snapshot_id(sid: Any) -> bool:
    """Only ids like this ever become file names, so no index content can reach outside the root."""
    return isinstance(sid, str) and bool(_ID_RE.match(sid))


# ---------------------------------------------------------------------------------------------
# Serialisation: cache objects <-> (tensors, JSON structure)


def _encode_state(x: Any, path: str, tensors: dict[str, mx.array]) -> Any:
    """A JSON tree for a layer's state; arrays go to `tensors` under their tree path."""
    if isinstance(x, mx.array):
        tensors[path] = x
        return {"a": path}
    if isinstance(x, (list, tuple)):
        tag = "l" if isinstance(x, list) else "t"
        return {tag: [_encode_state(v, f"{path}.{i}", tensors) for i, v in enumerate(x)]}
    if x is None or isinstance(x, (bool, int, float, str)):
        return {"v": x}
    raise TypeError(f"unserialisable cache state element: {type(x).__name__}")


def _decode_state(node: Any, tensors: dict[str, mx.array], depth: int = 0) -> Any:
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
        items = [_decode_state(v, tensors, depth + 1) for v in val]
        return items if tag == "l" else tuple(items)
    if tag == "v":
        if val is not None and not isinstance(val, (bool, int, float, str)):
            raise SnapshotError("bad state scalar")
        return val
    raise SnapshotError("bad state tag")


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
    if d.get("kind") not in KINDS:
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
    return SnapshotMeta(
        id=sid,
        model_key=key,
        tokens=tuple(tokens),
        kind=d["kind"],
        exact_cuts=tuple(cuts),
        classes=tuple(classes),
        trimmable=d["trimmable"],
        nbytes=d["nbytes"],
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


def file_meta(header: dict[str, Any]) -> tuple[SnapshotMeta, list[Any]]:
    """(meta, per-layer state structure) from a snapshot file's header."""
    md = header.get("__metadata__")
    if not isinstance(md, dict) or md.get("format") != FORMAT:
        raise ValueError("not a Verbatim snapshot")
    try:
        version = int(md.get("version", ""))
    except ValueError:
        raise ValueError("bad format version") from None
    if version != FORMAT_VERSION:
        raise ValueError(f"unsupported format version {version}")
    meta = meta_from_dict(json.loads(md.get("meta", "null")))
    layers = json.loads(md.get("layers", "null"))
    if not isinstance(layers, list) or len(layers) != len(meta.classes):
        raise ValueError("layer structure does not match the classes")
    return meta, layers


@dataclass
class Entry:
    meta: SnapshotMeta
    file_bytes: int
    sha256: str
    created: float
    last_used: float
    env: str  # compute_env() of the process that computed it

    def to_dict(self) -> dict[str, Any]:
        return {
            **meta_to_dict(self.meta),
            "env": self.env,
            "file_bytes": self.file_bytes,
            "sha256": self.sha256,
            "created": self.created,
            "last_used": self.last_used,
        }


def entry_from_dict(d: Any) -> Entry:
    meta = meta_from_dict(d)
    fb, sha = d.get("file_bytes"), d.get("sha256")
    if not _is_int(fb, 1, MAX_FILE_BYTES):
        raise ValueError("bad file size")
    if not isinstance(sha, str) or not _SHA_RE.match(sha):
        raise ValueError("bad checksum")
    times = [d.get("created", 0.0), d.get("last_used", 0.0)]
    if not all(isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t < 1e11 for t in times):
        raise ValueError("bad timestamps")
    env = d.get("env")
    if not isinstance(env, str) or len(env) > MAX_ENV_LEN:
        raise ValueError("bad environment")
    return Entry(meta, fb, sha, float(times[0]), float(times[1]), env)


def encode_snapshot(snap: Snapshot, env: str) -> tuple[dict[str, mx.array], dict[str, str]]:
    """(tensors, safetensors metadata) for `mx.save_safetensors`."""
    tensors: dict[str, mx.array] = {}
    layers = [_encode_state(c.state, str(i), tensors) for i, c in enumerate(snap.cache)]
    metadata = {
        "format": FORMAT,
        "version": str(FORMAT_VERSION),
        "meta": json.dumps(meta_to_dict(snap.meta), separators=(",", ":")),
        "layers": json.dumps(layers, separators=(",", ":")),
        "env": env,
    }
    return tensors, metadata


def decode_snapshot(data: bytes, entry: Entry, env: str) -> Snapshot:
    """Check a file's bytes against its index entry, then rebuild the cache objects.

    Raises `SnapshotError` for anything that does not match: size, checksum, header, compute
    environment, layer offsets, or a `trimmable` flag that the rebuilt caches contradict.
    """
    meta = entry.meta
    if len(data) != entry.file_bytes:
        raise SnapshotError(f"file size {len(data)} != {entry.file_bytes} (truncated or replaced)")
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        raise SnapshotError("checksum mismatch")
    try:
        header = read_header(data)
        fmeta, layers = file_meta(header)
        file_env = header["__metadata__"].get("env")
    except ValueError as e:
        raise SnapshotError(f"bad header: {e}") from None
    if meta_to_dict(fmeta) != meta_to_dict(meta) or file_env != entry.env or entry.env != env:
        raise SnapshotError("file does not match its index entry")
    try:
        tensors, _ = mx.load(io.BytesIO(data), format="safetensors", return_metadata=True)
        cache = []
        for cls_name, node in zip(meta.classes, layers):
            rules = rules_named(cls_name)
            assert rules is not None  # meta_from_dict accepted only persisted classes
            c = rules.restore(_decode_state(node, tensors))
            off = layer_offset(c)
            if off is not None and off != meta.length:
                raise SnapshotError(f"layer offset {off} != snapshot length {meta.length}")
            cache.append(c)
        mx.eval(list(tensors.values()))
    except SnapshotError:
        raise
    except Exception as e:  # MLX raises RuntimeError/ValueError on malformed tensors
        raise SnapshotError(f"cannot rebuild cache: {e}") from None
    return Snapshot(checked_trimmable(meta, cache), cache, source="disk")


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
