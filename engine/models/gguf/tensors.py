"""GGUF tensor data -> MLX weights, one tensor (and a bounded number of rows) at a time.

Every block type that gguf-py (llama.cpp's own GGUF library) can dequantize is accepted. Types
whose 32-value groups lie on a linear integer grid (Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q8_0)
are carried over *exactly* as MLX affine weights: the grid's step and origin are read back by
dequantizing the block with its quant bits forced to the lowest and the highest code, and every
value is checked to sit on that grid. 4-bit sources become 4-bit MLX weights, 5- and 8-bit ones
8-bit. Other types (Q2_K/Q3_K/Q6_K with 16-value sub-blocks, IQ and ternary types) have no such
grid: they are dequantized and requantized to 8 bits, group 32. Scales stay float32 so nothing
is rounded on the way. Float tensors (F32/F16/BF16) are kept in their own dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from engine.errors import GGUFError

GROUP = 32  # MLX group size used for every quantized weight
CHUNK_VALUES = 1 << 22  # dequantize at most this many values at once (16 MiB of float32)


@dataclass(frozen=True)
class GridLayout:
    """Where the quant codes sit in one block of a linear-grid type, and how wide they are."""

    bits: int  # bits per code in the source
    code_bytes: tuple[tuple[int, int], ...]  # byte ranges in the block holding the codes
    signed_bytes: bool = False  # Q8_0: the codes are int8 (lowest code is 0x80, highest 0x7F)


# ggml type id -> the code layout of the linear-grid types (block sizes from the GGUF spec)
GRID: dict[int, GridLayout] = {
    2: GridLayout(4, ((2, 18),)),  # Q4_0: f16 d, 16 bytes of nibbles
    3: GridLayout(4, ((4, 20),)),  # Q4_1: f16 d, f16 m, nibbles
    6: GridLayout(5, ((2, 22),)),  # Q5_0: f16 d, 4 bytes high bits, nibbles
    7: GridLayout(5, ((4, 24),)),  # Q5_1: f16 d, f16 m, high bits, nibbles
    8: GridLayout(8, ((2, 34),), signed_bytes=True),  # Q8_0: f16 d, 32 int8
    12: GridLayout(4, ((16, 144),)),  # Q4_K: f16 d, f16 dmin, 12 bytes of 6-bit scales, nibbles
    13: GridLayout(5, ((16, 176),)),  # Q5_K: as Q4_K plus 32 bytes of high bits
}
FLOAT_TYPES = {0: np.float32, 1: np.float16, 30: "bfloat16"}
NOT_FINITE = "non-finite values (NaN or infinity) in its data: the file is corrupt"


@dataclass(frozen=True)
class Plan:
    """What one tensor becomes: MLX bits (None: a float array) and how ("exact", "requantized",
    "float", "dequantized")."""

    bits: Optional[int]
    how: str


def plan(ggml_type: int, shape: tuple[int, ...], keep_float: bool) -> Plan:
    """The target for a tensor of this type and shape; `keep_float` for tensors the model needs
    unquantized (norms, biases)."""
    if ggml_type in FLOAT_TYPES:
        return Plan(None, "float")
    if keep_float or len(shape) != 2 or shape[-1] % GROUP:
        return Plan(None, "dequantized")
    if ggml_type in GRID:
        return Plan(4 if GRID[ggml_type].bits <= 4 else 8, "exact")
    return Plan(8, "requantized")


def supported(ggml_type: int) -> bool:
    """Whether gguf-py can dequantize this ggml type (or it is a plain float type)."""
    if ggml_type in FLOAT_TYPES:
        return True
    from gguf import GGMLQuantizationType
    from gguf.quants import (
        _type_traits,  # registered dequantizers, one per implemented type
    )

    try:
        return GGMLQuantizationType(ggml_type) in _type_traits
    except ValueError:
        return False


def _dequantize(blocks: np.ndarray, ggml_type: int) -> np.ndarray:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    with np.errstate(invalid="ignore", over="ignore"):  # garbage scales: reported just below
        w = dequantize(blocks, GGMLQuantizationType(ggml_type))
    return _finite(w)


def _finite(w: np.ndarray) -> np.ndarray:
    """`w`, or a GGUFError if it holds a NaN or an infinity: in a block's scales that is a corrupt
    (or garbage) file, and llama.cpp refuses such data too (ggml_validate_row_data)."""
    if not np.isfinite(w).all():
        raise GGUFError(NOT_FINITE)
    return w


def _exact_affine(rows: np.ndarray, ggml_type: int, n_cols: int) -> Optional[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(codes uint8, scales, biases) per 32-value group for linear-grid types, or None when a
    value is off the grid (then the caller requantizes)."""
    layout = GRID[ggml_type]
    w = _dequantize(rows, ggml_type).reshape(rows.shape[0], -1, GROUP)
    # the same blocks with every code forced to the lowest, then the highest value
    nb = rows.shape[1] // _block_bytes(ggml_type)
    lo = rows.reshape(rows.shape[0], nb, -1).copy()
    hi = lo.copy()
    for a, b in layout.code_bytes:
        lo[:, :, a:b] = 0x80 if layout.signed_bytes else 0x00
        hi[:, :, a:b] = 0x7F if layout.signed_bytes else 0xFF
    base = _dequantize(lo.reshape(rows.shape), ggml_type).reshape(w.shape)[..., :1]
    top = _dequantize(hi.reshape(rows.shape), ggml_type).reshape(w.shape)[..., :1]
    levels = (1 << layout.bits) - 1
    scale = (top - base) / levels
    safe = np.where(scale == 0, 1.0, scale)
    codes = np.rint((w - base) / safe)
    codes = np.where(scale == 0, 0.0, codes)
    if codes.min(initial=0) < 0 or codes.max(initial=0) > levels:
        return None
    err = np.abs(codes * scale + base - w).max(initial=0.0)
    if err > 1e-6 * max(float(np.abs(w).max(initial=0.0)), 1e-30):
        return None
    return codes.astype(np.uint8).reshape(rows.shape[0], n_cols), scale[..., 0], base[..., 0]


def _block_bytes(ggml_type: int) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    return GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)][1]


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """MLX's packing: consecutive codes fill a uint32 from the low bits up."""
    per = 32 // bits
    c = codes.astype(np.uint32).reshape(codes.shape[0], -1, per)
    shifts = (np.arange(per, dtype=np.uint32) * bits)[None, None, :]
    return np.bitwise_or.reduce(c << shifts, axis=-1)


def convert_tensor(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...], target: Plan,
                   transform: Optional[Callable[[np.ndarray], np.ndarray]] = None,
                   check: Optional[Callable[[], None]] = None) -> tuple[dict[str, Any], str]:
    """Raw bytes of one tensor -> MLX arrays {"weight", ["scales", "biases"]} and how it was
    converted ("exact", "requantized", "float", "dequantized").

    `raw` is the tensor's bytes (a view into the mapped file); rows are processed in chunks so
    a large embedding is never held as float32 all at once. `transform` edits float values
    (e.g. Gemma's norm shift) and forces a float result.
    """
    import mlx.core as mx

    n_rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    n_cols = shape[-1]
    if ggml_type in FLOAT_TYPES:
        if ggml_type == 30:
            arr = mx.array(np.frombuffer(raw, "<u2").reshape(shape)).view(mx.bfloat16)
        else:
            arr = mx.array(np.frombuffer(raw, FLOAT_TYPES[ggml_type]).reshape(shape))
        if not mx.isfinite(arr).all().item():
            raise GGUFError(NOT_FINITE)
        if transform is not None:
            arr = mx.array(transform(np.array(arr.astype(mx.float32)))).astype(arr.dtype)
        return {"weight": arr}, "float"
    rows = np.frombuffer(raw, np.uint8).reshape(n_rows, -1)
    if target.bits is None:
        w = _dequantize(rows, ggml_type).reshape(shape)
        if transform is not None:
            w = transform(w)
        return {"weight": mx.array(w.astype(np.float32))}, "dequantized"
    step = max(1, CHUNK_VALUES // n_cols)
    parts: list[tuple[Any, Any, Any]] = []
    how = target.how
    for r in range(0, n_rows, step):
        if check is not None:
            check()
        chunk = rows[r:r + step]
        got = _exact_affine(chunk, ggml_type, n_cols) if how == "exact" else None
        if got is not None:
            codes, scales, biases = got
            parts.append((mx.array(_pack(codes, target.bits)), mx.array(scales), mx.array(biases)))
        else:
            if how == "exact":  # a value off the grid: the whole tensor goes the safe way
                return convert_tensor(raw, ggml_type, shape, Plan(8, "requantized"), transform, check)
            w = mx.array(_dequantize(chunk, ggml_type))
            q, s, b = mx.quantize(w, group_size=GROUP, bits=target.bits)
            mx.eval(q, s, b)
            parts.append((q, s, b))
    cat = (lambda i: parts[0][i] if len(parts) == 1 else mx.concatenate([p[i] for p in parts]))
    out = {"weight": cat(0), "scales": cat(1), "biases": cat(2)}
    mx.eval(*out.values())
    return out, how
