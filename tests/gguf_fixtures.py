"""A small GGUF writer for tests: valid tiny files, and the raw pieces to build broken ones.

Written from the GGUF spec (github.com/ggml-org/ggml/blob/master/docs/gguf.md), independent of
engine/models/gguf/, so the reader is tested against a second implementation. Includes numpy
quantizers for Q8_0 / Q4_0 / Q4_1 and the K-quants Q2_K..Q6_K (the block layouts llama.cpp writes),
and tiny random models of each supported architecture written with gguf-py's GGUFWriter.
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


# --- K-quant blocks (llama.cpp's layouts, QK_K = 256 values per super-block) ---
#
# gguf-py can dequantize the K-quants but not write them, so these build the blocks from the
# layouts in ggml-quants.h: a simple (not llama.cpp's search-based) choice of scales, then the
# exact bit packing. `kquantize` also returns the values the blocks are *meant* to hold,
# computed from the chosen fields, so a test can check gguf-py dequantizes them to exactly that.

QK_K = 256
T_Q2_K, T_Q3_K, T_Q5_K, T_Q6_K = 10, 11, 13, 14
KQUANT_BLOCK_BYTES = {T_Q2_K: 84, T_Q3_K: 110, T_Q4_K: 144, T_Q5_K: 176, T_Q6_K: 210}
GGML_BLOCK_BYTES = {"Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210, "Q8_0": 34}  # by type name


def _f16(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float16 bytes as uint8 [n, 2], the float32 value they hold)."""
    h = np.ascontiguousarray(x, dtype=np.float16).reshape(-1, 1)
    return h.view(np.uint8).reshape(-1, 2), h.astype(np.float32)


def _codes(x: np.ndarray, scale: np.ndarray, offset: np.ndarray, lo: int, hi: int) -> np.ndarray:
    safe = np.where(scale == 0, 1.0, scale)
    return np.clip(np.rint((x + offset) / safe), lo, hi).astype(np.int32)


def _pack_bits(q: np.ndarray, bits: int, group: int) -> np.ndarray:
    """Codes [n, k*group*(8//bits)] -> bytes: within each run of 8//bits groups of `group`
    values, group s sits at bit 2s (bits=2), 4s (bits=4) or s (bits=1) of the same bytes."""
    n = q.shape[0]
    per = 8 // bits
    q = q.astype(np.uint8).reshape(n, -1, per, group)
    out = np.zeros((n, q.shape[1], group), np.uint8)
    for s in range(per):
        out |= (q[:, :, s] & ((1 << bits) - 1)) << (bits * s)
    return out.reshape(n, -1)


def _pack_scale_min_k4(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins per block -> the 12 bytes Q4_K/Q5_K store them in."""
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    out = np.zeros((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    return out


def _affine_k(x: np.ndarray, sub: int, levels: int, sbits: int) -> tuple[np.ndarray, ...]:
    """Scale + min sub-blocks (Q2_K, Q4_K, Q5_K): (d bytes, dmin bytes, sc, mn, q, intended)."""
    n = x.shape[0]
    xs = x.reshape(n, -1, sub)
    lo = np.minimum(xs.min(-1), 0.0)
    scale, mins = (xs.max(-1) - lo) / levels, -lo
    smax = (1 << sbits) - 1
    d_b, d = _f16(scale.max(-1) / smax)
    m_b, dmin = _f16(mins.max(-1) / smax)
    sc = np.clip(np.rint(scale / np.where(d == 0, 1, d)), 0, smax).astype(np.int32)
    mn = np.clip(np.rint(mins / np.where(dmin == 0, 1, dmin)), 0, smax).astype(np.int32)
    eff_d = (d * sc.astype(np.float32))[..., None]
    eff_m = (dmin * mn.astype(np.float32))[..., None]
    q = _codes(xs, eff_d, eff_m, 0, levels)
    return d_b, m_b, sc, mn, q.reshape(n, -1), (eff_d * q.astype(np.float32) - eff_m).reshape(n, -1)


def _symmetric_k(x: np.ndarray, sub: int, qmin: int, qmax: int, sbits: int) -> tuple[np.ndarray, ...]:
    """Signed scale sub-blocks (Q3_K, Q6_K): (d bytes, scales, q, intended)."""
    n = x.shape[0]
    xs = x.reshape(n, -1, sub)
    # as llama.cpp: the largest magnitude maps to the most negative code (the scale takes its sign)
    big = np.take_along_axis(xs, np.abs(xs).argmax(-1)[..., None], -1)[..., 0]
    s = big / qmin
    smax = (1 << (sbits - 1)) - 1
    d_b, d = _f16(np.abs(s).max(-1) / smax)
    sc = np.clip(np.rint(s / np.where(d == 0, 1, d)), -smax - 1, smax).astype(np.int32)
    eff = (d * sc.astype(np.float32))[..., None]
    q = _codes(xs, eff, np.float32(0), qmin, qmax)
    return d_b, sc, q.reshape(n, -1), (eff * q.astype(np.float32)).reshape(n, -1)


def kquantize(w: np.ndarray, ttype: int) -> tuple[bytes, np.ndarray]:
    """(K-quant blocks of `w`, the float32 values they stand for); w's rows are multiples of 256."""
    x = np.ascontiguousarray(w, dtype=np.float32).reshape(-1, QK_K)
    n = x.shape[0]
    if ttype in (T_Q4_K, T_Q5_K):
        levels = 15 if ttype == T_Q4_K else 31
        d_b, m_b, sc, mn, q, want = _affine_k(x, 32, levels, 6)
        parts = [d_b, m_b, _pack_scale_min_k4(sc, mn)]
        if ttype == T_Q5_K:
            parts.append(_pack_bits(q >> 4, 1, 32))  # bit s of byte l: the 5th bit of sub-block s
        parts.append(_pack_bits(q & 0x0F, 4, 32))
    elif ttype == T_Q2_K:
        d_b, m_b, sc, mn, q, want = _affine_k(x, 16, 3, 4)
        parts = [(sc | (mn << 4)).astype(np.uint8), _pack_bits(q, 2, 32), d_b, m_b]
    elif ttype == T_Q3_K:
        d_b, sc, q, want = _symmetric_k(x, 16, -4, 3, 6)
        u = (sc + 32).astype(np.uint8)  # six bits: low four in bytes 0-7, high two in bytes 8-11
        scales = np.concatenate([(u[:, :8] & 0x0F) | ((u[:, 8:] & 0x0F) << 4), _pack_bits(u >> 4, 2, 4)], axis=1)
        hmask = _pack_bits((q >= 0).astype(np.uint8), 1, 32)  # a set bit means "no -4 offset"
        parts = [hmask, _pack_bits(q & 3, 2, 32), scales, d_b]
    elif ttype == T_Q6_K:
        d_b, sc, q, want = _symmetric_k(x, 16, -32, 31, 8)
        u = (q + 32).astype(np.uint8)
        ql = _pack_bits(u & 0x0F, 4, 64)  # 128 values per half: low nibbles 0-63, high 64-127
        qh = _pack_bits(u >> 4, 2, 32)
        parts = [ql, qh, sc.astype(np.int8).view(np.uint8), d_b]
    else:
        raise ValueError(ttype)
    blocks = np.concatenate([p.reshape(n, -1) for p in parts], axis=1)
    assert blocks.shape[1] == KQUANT_BLOCK_BYTES[ttype], (ttype, blocks.shape)
    return blocks.tobytes(), want.reshape(w.shape)


# --- tiny random models of each architecture, written with gguf-py's GGUFWriter ---

# per architecture: (ggml type per matrix kind, tokenizer kind, tied embeddings, extra dims)
_MATRIX = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
SYNTHETIC: dict[str, dict[str, Any]] = {
    # a Q4_K_M-like llama: 4-bit K attention, Q5_K gate/up, Q6_K down and output, untied
    "llama": {"types": {"attn": T_Q4_K, "ffn_gate": T_Q5_K, "ffn_up": T_Q5_K, "ffn_down": T_Q6_K,
                        "token_embd": T_Q4_K, "output": T_Q6_K},
              "heads": (4, 2, 64), "tied": False, "tokenizer": "gpt2"},
    # a Q2_K / Q3_K file (the low-bit K-quants), Q8_0 embedding from gguf-py's own quantizer
    "qwen2": {"types": {"attn": T_Q3_K, "ffn_gate": T_Q2_K, "ffn_up": T_Q2_K, "ffn_down": T_Q4_K,
                        "token_embd": T_Q8_0},
              "heads": (4, 2, 64), "tied": True, "tokenizer": "gpt2"},
    "qwen3": {"types": {"attn": T_Q5_K, "ffn_gate": T_Q4_K, "ffn_up": T_Q4_K, "ffn_down": T_Q6_K,
                        "token_embd": T_Q5_K},
              "heads": (4, 2, 64), "tied": True, "tokenizer": "gpt2"},
    "gemma3": {"types": {"attn": T_Q4_K, "attn_v": T_Q6_K, "ffn_gate": T_Q4_K, "ffn_up": T_Q4_K,
                         "ffn_down": T_Q6_K, "token_embd": T_Q6_K},
               "heads": (4, 1, 64), "tied": True, "tokenizer": "spm"},
}
HIDDEN, FFN, LAYERS = 256, 512, 2
GEMMA_WINDOW = 8  # sliding window of the synthetic Gemma 3 (layer 0 sliding, layer 1 global)

_SPM_WORDS = ("the", "water", "cycle", "describes", "how", "moves", "between", "land", "oceans", "and", "air",
              "sun", "heats", "in", "lakes", "rivers", "some", "of", "it", "evaporates", "capital", "France",
              "is", "Paris", "why", "sky", "blue", "hello", "world")


def spm_vocab() -> tuple[list[str], list[float], list[int]]:
    """A small SentencePiece vocabulary like Gemma's: control tokens, 256 byte pieces, then
    characters and every prefix of a few words (each splits into two known pieces)."""
    NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6  # llama.cpp's token types

    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    types = [CONTROL, CONTROL, CONTROL, UNKNOWN, CONTROL, CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [BYTE] * 256
    pieces: list[str] = ["▁"] + sorted(set("".join(_SPM_WORDS)))
    for w in _SPM_WORDS:
        w = "▁" + w
        pieces += [w[:k] for k in range(2, len(w) + 1)]
    pieces = list(dict.fromkeys(p for p in pieces if p not in tokens))
    scores = [0.0] * len(tokens) + [-float(i) for i in range(len(pieces))]
    return tokens + pieces, scores, types + [NORMAL] * len(pieces)


def synthetic_gguf(out: Path, arch: str, seed: int = 0, drop: frozenset[str] | set[str] = frozenset()) -> Path:
    """A 2-layer random `arch` model (hidden 256) with K-quant matrices, written by gguf-py;
    the tensors named in `drop` are left out."""
    import gguf
    from gguf.quants import quantize as gguf_quantize

    spec = SYNTHETIC[arch]
    heads, kv_heads, hd = spec["heads"]
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(out), arch)
    w.add_name(f"synthetic {arch}")
    w.add_context_length(2048)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_block_count(LAYERS)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(1e-6 if arch == "gemma3" else 1e-5)
    w.add_rope_freq_base(10000.0 if arch == "llama" else 1e6)
    if arch == "gemma3":
        w.add_sliding_window(GEMMA_WINDOW)
        w.add_sliding_window_pattern(2)
        w.add_rope_freq_base_swa(10000.0)
    if spec["tokenizer"] == "gpt2":
        from tests.tiny_models import build_tokenizer

        folder = out.parent / f"{out.stem}-tokenizer"
        folder.mkdir(exist_ok=True)
        build_tokenizer(folder)
        tok = json.loads((folder / "tokenizer.json").read_text())
        vocab = tok["model"]["vocab"]
        tokens = sorted(vocab, key=vocab.get)
        special = {a["content"] for a in tok["added_tokens"] if a.get("special")}
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt-2")
        w.add_token_list(tokens)
        w.add_token_types([3 if t in special else 1 for t in tokens])
        w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
        w.add_eos_token_id(vocab["<|im_end|>"])
        w.add_pad_token_id(vocab["<|endoftext|>"])
        w.add_add_bos_token(False)
        if arch == "llama":  # the others use the importer's built-in ChatML
            from tests.tiny_models import CHATML_TEMPLATE

            w.add_chat_template(CHATML_TEMPLATE)
    else:
        tokens, scores, types = spm_vocab()
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(2)
        w.add_eos_token_id(1)
        w.add_unk_token_id(3)
        w.add_pad_token_id(0)
        w.add_add_bos_token(True)
    vocab_size = len(tokens)

    def matrix(name: str, shape: tuple[int, int], ttype: int, scale: float) -> None:
        m = (rng.standard_normal(shape) * scale).astype(np.float32)
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            m = permute_qk(m, heads if "attn_q" in name else kv_heads)  # as llama.cpp's converter
        if ttype == T_Q8_0:
            data = gguf_quantize(m, gguf.GGMLQuantizationType.Q8_0)
        else:
            data = np.frombuffer(kquantize(m, ttype)[0], np.uint8).reshape(shape[0], -1)
        if name not in drop:
            w.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType(ttype))

    def vector(name: str, n: int, mean: float, scale: float) -> None:
        v = (mean + rng.standard_normal(n) * scale).astype(np.float32)
        if name not in drop:
            w.add_tensor(name, v)

    types = spec["types"]
    matrix("token_embd.weight", (vocab_size, HIDDEN), types["token_embd"], 1.0)
    for i in range(LAYERS):
        b = f"blk.{i}."
        out_dims = {"attn_q": heads * hd, "attn_k": kv_heads * hd, "attn_v": kv_heads * hd,
                    "attn_output": HIDDEN, "ffn_gate": FFN, "ffn_up": FFN, "ffn_down": HIDDEN}
        for kind in _MATRIX:
            fan_in = {"attn_output": heads * hd, "ffn_down": FFN}.get(kind, HIDDEN)
            ttype = types.get(kind, types["attn"] if kind.startswith("attn") else None)
            matrix(b + kind + ".weight", (out_dims[kind], fan_in), ttype, fan_in ** -0.5)
        norms = ["attn_norm", "ffn_norm"]
        if arch in ("qwen3", "gemma3"):
            norms += ["attn_q_norm", "attn_k_norm"]
        if arch == "gemma3":
            norms += ["post_attention_norm", "post_ffw_norm"]
        for norm in norms:
            # llama.cpp stores Gemma's norm weights as 1 + w; the others hold the weight itself
            vector(b + norm + ".weight", hd if "_q_" in norm or "_k_" in norm else HIDDEN, 1.0, 0.1)
        if arch == "qwen2":
            for kind in ("attn_q", "attn_k", "attn_v"):
                vector(b + kind + ".bias", out_dims[kind], 0.0, 0.5)
    vector("output_norm.weight", HIDDEN, 1.0, 0.1)
    if not spec["tied"]:
        matrix("output.weight", (vocab_size, HIDDEN), types["output"], HIDDEN ** -0.5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
