"""A small GGUF writer for tests: valid tiny files, and the raw pieces to build broken ones.

Written from the GGUF spec (github.com/ggml-org/ggml/blob/master/docs/gguf.md), independent of
engine/models/gguf/, so the reader is tested against a second implementation. Includes numpy
quantizers for Q8_0 / Q4_0 / Q4_1 (the block layouts llama.cpp writes).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

# GGUF metadata value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
# ggml tensor types
T_F32, T_F16, T_Q4_0, T_Q4_1, T_Q8_0, T_Q4_K, T_I32, T_BF16 = 0, 1, 2, 3, 8, 12, 26, 30

_SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
           BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}


def gstr(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def _auto_type(v: Any) -> int:
    if isinstance(v, bool):
        return BOOL
    if isinstance(v, int):
        return U32 if v >= 0 else I32
    if isinstance(v, float):
        return F32
    if isinstance(v, str):
        return STR
    if isinstance(v, (list, tuple)):
        return ARR
    raise TypeError(v)


def gvalue(vtype: int, v: Any) -> bytes:
    if vtype == STR:
        return gstr(v)
    if vtype == ARR:
        etype = _auto_type(v[0]) if v else U32
        if etype == U32 and any(x < 0 for x in v):
            etype = I32
        return struct.pack("<IQ", etype, len(v)) + b"".join(gvalue(etype, x) for x in v)
    return struct.pack(_SCALAR[vtype], v)


def kv(key: str, v: Any, vtype: int | None = None) -> bytes:
    vtype = _auto_type(v) if vtype is None else vtype
    return gstr(key) + struct.pack("<I", vtype) + gvalue(vtype, v)


# --- quantizers (numpy arrays are row-major [rows, cols]; blocks run along cols) ---

def quantize(w: np.ndarray, ttype: int) -> bytes:
    w = np.ascontiguousarray(w, dtype=np.float32)
    if ttype == T_F32:
        return w.tobytes()
    if ttype == T_F16:
        return w.astype(np.float16).tobytes()
    if ttype == T_BF16:
        return (w.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    blocks = w.reshape(-1, 32)
    if ttype == T_Q8_0:
        amax = np.abs(blocks).max(axis=1, keepdims=True)
        d = (amax / 127.0).astype(np.float16)
        inv = np.where(d == 0, 0, 1.0 / d.astype(np.float32))
        q = np.clip(np.round(blocks * inv), -127, 127).astype(np.int8)
        out = np.zeros((len(blocks), 34), np.uint8)
        out[:, :2] = d.view(np.uint8)
        out[:, 2:] = q.view(np.uint8)
        return out.tobytes()
    if ttype in (T_Q4_0, T_Q4_1):
        if ttype == T_Q4_0:
            idx = np.abs(blocks).argmax(axis=1)
            mx_ = blocks[np.arange(len(blocks)), idx][:, None]
            d = (mx_ / -8.0).astype(np.float16)
            inv = np.where(d == 0, 0, 1.0 / d.astype(np.float32))
            q = np.clip(np.floor(blocks * inv + 8.5), 0, 15).astype(np.uint8)
            head = d.view(np.uint8)
        else:
            lo = blocks.min(axis=1, keepdims=True)
            hi = blocks.max(axis=1, keepdims=True)
            d = ((hi - lo) / 15.0).astype(np.float16)
            m = lo.astype(np.float16)
            inv = np.where(d == 0, 0, 1.0 / d.astype(np.float32))
            q = np.clip(np.round((blocks - m.astype(np.float32)) * inv), 0, 15).astype(np.uint8)
            head = np.concatenate([d.view(np.uint8), m.view(np.uint8)], axis=1)
        packed = (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)
        return np.concatenate([head, packed], axis=1).tobytes()
    raise ValueError(ttype)


def dequantize(raw: bytes, ttype: int, shape: tuple[int, ...]) -> np.ndarray:
    """Reference dequantizer (numpy), used by the round-trip tests on the real GGUF."""
    n = int(np.prod(shape))
    if ttype == T_F32:
        return np.frombuffer(raw, np.float32, n).reshape(shape)
    if ttype == T_F16:
        return np.frombuffer(raw, np.float16, n).astype(np.float32).reshape(shape)
    b = np.frombuffer(raw, np.uint8)
    if ttype == T_Q8_0:
        b = b.reshape(-1, 34)
        d = b[:, :2].copy().view(np.float16).astype(np.float32)
        q = b[:, 2:].copy().view(np.int8).astype(np.float32)
        return (q * d).reshape(shape)
    if ttype in (T_Q4_0, T_Q4_1):
        bs = 18 if ttype == T_Q4_0 else 20
        b = b.reshape(-1, bs)
        d = b[:, :2].copy().view(np.float16).astype(np.float32)
        qs = b[:, bs - 16:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
        if ttype == T_Q4_0:
            return ((q - 8.0) * d).reshape(shape)
        m = b[:, 2:4].copy().view(np.float16).astype(np.float32)
        return (q * d + m).reshape(shape)
    raise ValueError(ttype)


def write_gguf(
    path: Path,
    metadata: list[bytes],
    tensors: list[tuple[str, tuple[int, ...], int, bytes]],
    *,
    version: int = 3,
    alignment: int = 32,
    magic: bytes = b"GGUF",
    tensor_count: int | None = None,
    kv_count: int | None = None,
) -> Path:
    """Write a GGUF. `tensors` are (name, numpy-order shape, ggml type, raw data)."""
    head = magic + struct.pack("<I", version)
    head += struct.pack("<QQ", len(tensors) if tensor_count is None else tensor_count,
                        len(metadata) if kv_count is None else kv_count)
    head += b"".join(metadata)
    infos, data, off = b"", b"", 0
    for name, shape, ttype, raw in tensors:
        pad = (-off) % alignment
        data += b"\0" * pad
        off += pad
        ne = tuple(reversed(shape))  # GGUF lists the fastest-varying dimension first
        infos += gstr(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        infos += struct.pack("<IQ", ttype, off)
        data += raw
        off += len(raw)
    body = head + infos
    body += b"\0" * ((-len(body)) % alignment)
    Path(path).write_bytes(body + data)
    return Path(path)


# --- a tiny llama GGUF made from an tests/tiny_models.py folder ---

def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF row order -> GGUF row order (what llama.cpp's convert script does for Q and K)."""
    out, inp = w.shape
    return w.reshape(n_head, 2, out // n_head // 2, inp).swapaxes(1, 2).reshape(out, inp)


_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(hf: str) -> str:
    if hf in _NAMES:
        return _NAMES[hf]
    parts = hf.split(".")  # model.layers.N.<module...>.weight
    return f"blk.{parts[2]}.{_LAYER['.'.join(parts[3:-1])]}.weight"


def tiny_llama_gguf(folder: Path, out: Path, ttype: int = T_F32, arch: str = "llama",
                    extra_kv: list[bytes] = ()) -> Path:
    """Turn a tiny.py llama folder into a GGUF: matrices in `ttype`, norms in F32."""
    import mlx.core as mx

    cfg = json.loads((folder / "config.json").read_text())
    tok = json.loads((folder / "tokenizer.json").read_text())
    weights = {k: np.array(v) for k, v in mx.load(str(folder / "model.safetensors")).items()}
    vocab = tok["model"]["vocab"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    special = {a["content"] for a in tok["added_tokens"] if a.get("special")}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    md = [
        kv("general.architecture", arch),
        kv("general.name", "tiny"),
        kv(f"{arch}.context_length", cfg["max_position_embeddings"]),
        kv(f"{arch}.embedding_length", cfg["hidden_size"]),
        kv(f"{arch}.feed_forward_length", cfg["intermediate_size"]),
        kv(f"{arch}.block_count", cfg["num_hidden_layers"]),
        kv(f"{arch}.attention.head_count", cfg["num_attention_heads"]),
        kv(f"{arch}.attention.head_count_kv", cfg["num_key_value_heads"]),
        kv(f"{arch}.attention.layer_norm_rms_epsilon", float(cfg["rms_norm_eps"])),
        kv(f"{arch}.rope.freq_base", float(cfg["rope_theta"])),
        kv(f"{arch}.rope.dimension_count", cfg["head_dim"]),
        kv("tokenizer.ggml.model", "gpt2"),
        kv("tokenizer.ggml.pre", "gpt-2"),
        kv("tokenizer.ggml.tokens", tokens),
        kv("tokenizer.ggml.token_type", [3 if t in special else 1 for t in tokens], ),
        kv("tokenizer.ggml.merges", merges),
        kv("tokenizer.ggml.eos_token_id", vocab["<|im_end|>"]),
        kv("tokenizer.ggml.padding_token_id", vocab["<|endoftext|>"]),
        kv("tokenizer.ggml.add_bos_token", False),
        kv("tokenizer.chat_template", json.loads((folder / "tokenizer_config.json").read_text())["chat_template"]),
        *extra_kv,
    ]
    tensors = []
    for name, w in sorted(weights.items()):
        if name.endswith("q_proj.weight"):
            w = permute_qk(w, cfg["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            w = permute_qk(w, cfg["num_key_value_heads"])
        t = ttype if w.ndim == 2 else T_F32
        tensors.append((gguf_name(name), w.shape, t, quantize(w, t)))
    return write_gguf(out, md, tensors)
