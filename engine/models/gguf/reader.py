"""A validating GGUF reader: header, metadata and tensor table, checked before anything is read.

Every count, length and offset is checked against the file size *before* anything is
allocated, so truncated, garbage or hostile files end in a `GGUFError` instead of a crash or a
runaway allocation. Tensor data is not read here (see convert.py).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import GGUFError

# --- format constants ---

_VALUE_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
              10: "<Q", 11: "<q", 12: "<d"}
_NP_DTYPE = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?",
             10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9

# ggml type id -> (name, elements per block, bytes per block)
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
}
MAX_DIMS = 4
MAX_ARRAY_DEPTH = 3
# Caps far above any real model (vocabularies ~250k, ~1k-100k tensors, <100 metadata keys)
# that keep a hostile header from making millions of Python objects out of a big file.
MAX_KV = 1 << 16
MAX_TENSORS = 1 << 20
MAX_LIST = 1 << 23


def type_name(t: int) -> str:
    return GGML_TYPES.get(t, (f"type {t}",))[0]


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order (slowest dimension first), unlike GGUF's ne[]
    ggml_type: int
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return type_name(self.ggml_type)


@dataclass
class GGUFFile:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    alignment: int
    data_offset: int
    size: int

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFError("missing general.architecture in the metadata")
        return arch


# --- reader ---

class _Cursor:
    """Bounds-checked reads over the mapped file: a short read is a GGUFError, never an IndexError."""

    def __init__(self, buf: Any, size: int) -> None:
        self.buf, self.size, self.pos = buf, size, 0

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise GGUFError(f"file is truncated or corrupt: {what} at byte {self.pos} runs past the end ({self.size} bytes)")

    def unpack(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def string(self, what: str) -> str:
        n = self.unpack("<Q", f"length of {what}")
        self.need(n, what)  # bounds the allocation by the file size
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int, what: str, depth: int = 0) -> Any:
        if vtype in _VALUE_FMT:
            return self.unpack(_VALUE_FMT[vtype], what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                raise GGUFError(f"{what}: arrays nested deeper than {MAX_ARRAY_DEPTH}")
            etype = self.unpack("<I", f"element type of {what}")
            count = self.unpack("<Q", f"length of {what}")
            if etype in _VALUE_FMT:
                n = count * struct.calcsize(_VALUE_FMT[etype])
                self.need(n, what)
                # numpy, not a list: one byte in the file stays about one byte in memory
                arr = np.frombuffer(self.buf, _NP_DTYPE[etype], count, self.pos).copy()
                self.pos += n
                return arr
            if etype not in (_STRING, _ARRAY):
                raise GGUFError(f"{what}: unknown array element type {etype}")
            # each element takes at least 8 bytes (a length), so the count is bounded by the file
            self.need(count * 8, what)
            if count > MAX_LIST:
                raise GGUFError(f"{what}: {count} elements is more than the {MAX_LIST} supported")
            return [self.value(etype, what, depth + 1) for _ in range(count)]
        raise GGUFError(f"{what}: unknown metadata value type {vtype}")


def read_gguf(path: Path | str) -> GGUFFile:
    """Parse and validate the header, metadata and tensor table of a GGUF file (no tensor data)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        f = open(path, "rb")
    except OSError as e:
        raise GGUFError(f"cannot read {path}: {e.strerror or e}") from None
    with f:
        if size < 24:
            raise GGUFError(f"{path.name} is not a GGUF file (only {size} bytes)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return _parse(path, mm, size)


def _parse(path: Path, buf: Any, size: int) -> GGUFFile:
    c = _Cursor(buf, size)
    magic = bytes(buf[:4])
    if magic != b"GGUF":
        raise GGUFError(f"{path.name} is not a GGUF file (magic {magic!r}, expected b'GGUF')")
    c.pos = 4
    version = c.unpack("<I", "version")
    if version not in (2, 3):
        raise GGUFError(f"unsupported GGUF version {version} (supported: 2, 3)")
    n_tensors = c.unpack("<Q", "tensor count")
    n_kv = c.unpack("<Q", "metadata count")
    # smallest possible entries: kv = key length (8) + type (4) + 1-byte value;
    # tensor = name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8)
    if n_kv * 13 > size - c.pos:
        raise GGUFError(f"corrupt header: {n_kv} metadata entries cannot fit in {size} bytes")
    if n_tensors * 32 > size - c.pos:
        raise GGUFError(f"corrupt header: {n_tensors} tensors cannot fit in {size} bytes")
    if n_kv > MAX_KV or n_tensors > MAX_TENSORS:
        raise GGUFError(f"implausible header: {n_kv} metadata entries, {n_tensors} tensors")

    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key = c.string(f"metadata key {i}")
        vtype = c.unpack("<I", f"type of {key!r}")
        if key in metadata:
            raise GGUFError(f"duplicate metadata key {key!r}")
        metadata[key] = c.value(vtype, f"metadata {key!r}")

    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1) or alignment > 1 << 20:
        raise GGUFError(f"invalid general.alignment {alignment!r} (must be a power of two)")

    raw: list[tuple[str, tuple[int, ...], int, int]] = []
    for i in range(n_tensors):
        name = c.string(f"name of tensor {i}")
        n_dims = c.unpack("<I", f"rank of tensor {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise GGUFError(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        ne = [c.unpack("<Q", f"shape of tensor {name!r}") for _ in range(n_dims)]
        ttype = c.unpack("<I", f"type of tensor {name!r}")
        offset = c.unpack("<Q", f"offset of tensor {name!r}")
        raw.append((name, tuple(reversed(ne)), ttype, offset))

    data_offset = c.pos + (-c.pos) % alignment
    tensors: dict[str, TensorInfo] = {}
    for name, shape, ttype, offset in raw:
        if name in tensors:
            raise GGUFError(f"duplicate tensor name {name!r}")
        if ttype not in GGML_TYPES:
            raise GGUFError(f"tensor {name!r} has unknown ggml type {ttype}")
        if any(d == 0 for d in shape):
            raise GGUFError(f"tensor {name!r} has an empty dimension {shape}")
        _, block, bsize = GGML_TYPES[ttype]
        n = int(np.prod(shape, dtype=object))  # exact, no overflow
        if shape[-1] % block:
            raise GGUFError(f"tensor {name!r}: row length {shape[-1]} is not a multiple of the {type_name(ttype)} block size {block}")
        nbytes = n // block * bsize
        if offset % alignment:
            raise GGUFError(f"tensor {name!r}: offset {offset} is not aligned to {alignment}")
        start = data_offset + offset
        if start + nbytes > size:
            raise GGUFError(
                f"tensor {name!r} ({nbytes} bytes at {start}) runs past the end of the file ({size} bytes): truncated or corrupt")
        tensors[name] = TensorInfo(name, shape, ttype, start, nbytes)
    # each tensor's bytes are its own: an overlap means a wrong type, shape or offset in the table
    by_offset = sorted(tensors.values(), key=lambda t: t.offset)
    for a, b in pairwise(by_offset):
        if b.offset < a.offset + a.nbytes:
            raise GGUFError(f"tensors {a.name!r} and {b.name!r} overlap in the file: corrupt tensor table "
                            f"(wrong type, shape or offset)")
    return GGUFFile(path, version, metadata, tensors, alignment, data_offset, size)


