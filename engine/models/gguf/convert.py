"""GGUF files: a validating reader and a converter to an mlx-lm model folder.

The header, metadata and tensor table are parsed here in Python, with every count, length and
offset checked against the file size *before* anything is allocated, so truncated, garbage or
hostile files end in a `GGUFError` instead of a crash or a runaway allocation. Only then are the
tensors read: quantized ones through `mx.load` (which maps Q4_0 / Q4_1 / Q8_0 blocks one-to-one
onto MLX affine triplets, group size 32), float ones straight from the file (`mx.load` turns BF16
into F16, which overflows, and returns K-quants as unverified F16, so we never let it see those).

llama architecture only: GGUF stores Q/K rows permuted for interleaved RoPE, which is exactly
mlx-lm's `rope_traditional: true`, so the weights are used as stored.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

Progress = Callable[[float, str], None]
CONVERTER_VERSION = 1  # bump when the produced folder changes: old imports are redone


from engine.errors import Cancelled, GGUFError
from engine.types import CancelToken

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
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
}
QUANTIZED = {2: 4, 3: 4, 8: 8}  # supported block types -> MLX bits (group size 32)
FLOATS = {0: "float32", 1: "float16", 30: "bfloat16"}
SUPPORTED_TYPES = set(QUANTIZED) | set(FLOATS)
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
    return GGUFFile(path, version, metadata, tensors, alignment, data_offset, size)


# --- llama mapping ---

_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
SUPPORTED_ARCHITECTURES = ("llama",)


def mlx_name(gguf_name: str, n_layers: int) -> str:
    """GGUF tensor name (without suffix) -> mlx-lm llama module path; GGUFError if unknown."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        if int(parts[1]) >= n_layers:
            raise GGUFError(f"tensor {gguf_name!r} is beyond block_count {n_layers}")
        return f"model.layers.{int(parts[1])}.{_LAYER_NAMES[parts[2]]}"
    if gguf_name == "rope_freqs":
        raise GGUFError("unsupported: Llama 3.1-style RoPE frequency scaling (rope_freqs tensor)")
    if "_exps" in gguf_name or "ffn_gate_inp" in gguf_name:
        raise GGUFError("unsupported: mixture-of-experts llama models")
    raise GGUFError(f"unsupported tensor {gguf_name!r} for the llama architecture")


def _meta_int(md: dict[str, Any], key: str, default: Optional[int] = None) -> int:
    v = md.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        if v is None:
            raise GGUFError(f"missing {key} in the metadata")
        raise GGUFError(f"invalid {key} = {v!r} (expected one positive integer)")
    return v


def _f32(v: Any) -> float:
    """A float32 metadata value as the short decimal it was written from (1e-05, not 9.99e-06)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise GGUFError(f"invalid numeric metadata value {v!r}")
    return float(str(np.float32(v)))


def llama_config(g: GGUFFile) -> dict[str, Any]:
    """The mlx-lm config.json for a llama GGUF (without the quantization section)."""
    arch = g.architecture
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GGUFError(f"unsupported architecture {arch!r} (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    md = g.metadata
    hidden = _meta_int(md, f"{arch}.embedding_length")
    heads = _meta_int(md, f"{arch}.attention.head_count")
    kv_heads = _meta_int(md, f"{arch}.attention.head_count_kv", heads)
    head_dim = _meta_int(md, f"{arch}.attention.key_length", hidden // heads if hidden % heads == 0 else None)
    rope_dim = _meta_int(md, f"{arch}.rope.dimension_count", head_dim)
    if rope_dim != head_dim:
        raise GGUFError(f"unsupported: partial rotary embedding ({rope_dim} of {head_dim} dims)")
    if md.get(f"{arch}.expert_count", 0):
        raise GGUFError("unsupported: mixture-of-experts llama models")
    if heads % kv_heads:
        raise GGUFError(f"invalid head counts: {heads} query heads, {kv_heads} kv heads")
    tokens = md.get("tokenizer.ggml.tokens")
    vocab = len(tokens) if isinstance(tokens, list) else _meta_int(md, f"{arch}.vocab_size")
    eps = md.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    theta = md.get(f"{arch}.rope.freq_base", 10000.0)
    config: dict[str, Any] = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "num_hidden_layers": _meta_int(md, f"{arch}.block_count"),
        "intermediate_size": _meta_int(md, f"{arch}.feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": _f32(eps),
        "rope_theta": _f32(theta),
        "rope_traditional": True,  # GGUF's Q/K row order is the interleaved RoPE layout
        "max_position_embeddings": _meta_int(md, f"{arch}.context_length", 4096),
        "vocab_size": vocab,
        "tie_word_embeddings": "output.weight" not in g.tensors,
        "attention_bias": False,
        "mlp_bias": False,
    }
    scaling = md.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        factor = md.get(f"{arch}.rope.scaling.factor")
        if scaling != "linear" or not isinstance(factor, (int, float)) or factor <= 0:
            raise GGUFError(f"unsupported RoPE scaling {scaling!r}")
        config["rope_scaling"] = {"type": "linear", "factor": float(factor)}
    return config


# --- tokenizer ---

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _pre_tokenizer(pre: str) -> Any:
    """llama.cpp's `tokenizer.ggml.pre` names -> the matching HF pre-tokenizer."""
    from tokenizers import Regex
    from tokenizers import pre_tokenizers as pt

    byte_level = pt.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=True)
    raw_bytes = pt.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    if pre in ("default", "gpt-2", "gpt2"):
        return byte_level
    if pre in ("smollm", "starcoder", "refact"):  # digits one by one, then GPT-2 splitting
        return pt.Sequence([pt.Digits(individual_digits=True), byte_level])
    if pre in ("llama3", "llama-bpe", "dbrx", "smaug-bpe"):
        return pt.Sequence([pt.Split(Regex(_LLAMA3_SPLIT), "isolated"), raw_bytes])
    if pre == "qwen2":
        return pt.Sequence([pt.Split(Regex(_QWEN2_SPLIT), "isolated"), raw_bytes])
    raise GGUFError(f"unsupported tokenizer pre-tokenizer {pre!r} (supported: gpt-2, smollm, llama-bpe, qwen2)")


def build_tokenizer(md: dict[str, Any], config: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The HF `tokenizers.Tokenizer` and tokenizer_config.json contents from GGUF metadata."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    kind = md.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFError(f"unsupported tokenizer model {kind!r} (supported: gpt2-style byte-level BPE)")
    tokens = md.get("tokenizer.ggml.tokens")
    merges = md.get("tokenizer.ggml.merges")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise GGUFError("missing or invalid tokenizer.ggml.tokens")
    if not isinstance(merges, list) or not all(isinstance(m, str) and " " in m for m in merges):
        raise GGUFError("missing or invalid tokenizer.ggml.merges")
    types = md.get("tokenizer.ggml.token_type", np.ones(len(tokens), np.int32))
    if not isinstance(types, np.ndarray) or types.ndim != 1 or len(types) != len(tokens):
        raise GGUFError("tokenizer.ggml.token_type does not match the token list")
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)  # duplicate strings (some GGUFs pad with them): first id wins
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = _pre_tokenizer(str(md.get("tokenizer.ggml.pre", "default")))
    tok.decoder = decoders.ByteLevel()
    # control tokens (3) are special; user-defined ones (4) match verbatim but are kept in decode
    added = [AddedToken(t, special=int(ty) == 3, normalized=False) for t, ty in zip(tokens, types.tolist()) if ty in (3, 4)]
    if added:
        tok.add_tokens(added)  # same ids: they are already in the vocab

    def token_at(key: str) -> Optional[str]:
        i = md.get(key)
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    bos, eos = token_at("tokenizer.ggml.bos_token_id"), token_at("tokenizer.ggml.eos_token_id")
    add_bos = bool(md.get("tokenizer.ggml.add_bos_token", False)) and bos is not None
    if add_bos:
        bos_id = md["tokenizer.ggml.bos_token_id"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, bos_id)])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok_config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": token_at("tokenizer.ggml.unknown_token_id"),
        "pad_token": token_at("tokenizer.ggml.padding_token_id"),
        "add_bos_token": add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
    }
    template = md.get("tokenizer.chat_template")
    if isinstance(template, str):
        tok_config["chat_template"] = template
    return tok, tok_config


# --- conversion ---

def _check_cancel(cancel: Optional[CancelToken]) -> None:
    if cancel is not None and cancel.cancelled:
        raise Cancelled("import cancelled")


def _float_tensor(g: GGUFFile, t: TensorInfo) -> Any:
    """F32 / F16 / BF16 tensor read directly from the file (exact, no F16 round trip)."""
    import mlx.core as mx

    n = int(np.prod(t.shape))
    with open(g.path, "rb") as f:
        f.seek(t.offset)
        raw = f.read(t.nbytes)
    if len(raw) != t.nbytes:
        raise GGUFError(f"tensor {t.name!r}: file changed or truncated while reading")
    if t.ggml_type == 30:
        return mx.array(np.frombuffer(raw, "<u2", n).reshape(t.shape)).view(mx.bfloat16)
    return mx.array(np.frombuffer(raw, "<f4" if t.ggml_type == 0 else "<f2", n).reshape(t.shape))


def convert(path: Path | str, out_dir: Path | str, progress: Optional[Progress] = None,
            cancel: Optional[CancelToken] = None, info: Optional[GGUFFile] = None) -> Path:
    """Convert a llama GGUF into an mlx-lm folder at `out_dir` (which must not exist yet).

    Writes into a temp folder next to `out_dir` and renames it into place, so a crash or a
    cancel never leaves a half-written model behind.
    """
    import mlx.core as mx

    report = progress or (lambda f, m: None)
    out_dir = Path(out_dir)
    g = info or read_gguf(path)
    # validate everything before the (slow) tensor load: architecture, tensor types, config
    if g.architecture not in SUPPORTED_ARCHITECTURES:
        raise GGUFError(f"unsupported architecture {g.architecture!r} (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    bad = sorted({t.type_name for t in g.tensors.values() if t.ggml_type not in SUPPORTED_TYPES})
    if bad:
        raise GGUFError(f"unsupported tensor type(s) {', '.join(bad)} (supported: F32, F16, BF16, Q4_0, Q4_1, Q8_0)")
    config = llama_config(g)
    n_layers = config["num_hidden_layers"]
    names = {t.name: mlx_name(t.name.removesuffix(".weight"), n_layers) for t in g.tensors.values()}
    for t in g.tensors.values():
        if not t.name.endswith(".weight"):
            raise GGUFError(f"unsupported tensor {t.name!r} for the llama architecture")
        if t.ggml_type in QUANTIZED and len(t.shape) != 2:
            raise GGUFError(f"tensor {t.name!r}: quantized tensors must be matrices, got shape {t.shape}")
    for required in ("token_embd.weight", "output_norm.weight"):
        if required not in g.tensors:
            raise GGUFError(f"missing tensor {required!r}")
    tokenizer, tok_config = build_tokenizer(g.metadata, config)
    _check_cancel(cancel)

    report(0.1, "reading tensors")
    quantized = [t for t in g.tensors.values() if t.ggml_type in QUANTIZED]
    loaded: dict[str, Any] = mx.load(str(g.path)) if quantized else {}
    _check_cancel(cancel)
    weights: dict[str, Any] = {}
    per_layer: dict[str, dict[str, int]] = {}
    bits_count: dict[int, int] = {}
    for t in g.tensors.values():
        base = names[t.name]
        if t.ggml_type in QUANTIZED:
            stem = t.name.removesuffix(".weight")
            try:
                w, s, b = loaded[f"{stem}.weight"], loaded[f"{stem}.scales"], loaded[f"{stem}.biases"]
            except KeyError:
                raise GGUFError(f"tensor {t.name!r} did not load as a quantized array") from None
            bits = QUANTIZED[t.ggml_type]
            if w.shape != (t.shape[0], t.shape[1] * bits // 32):
                raise GGUFError(f"tensor {t.name!r} loaded with an unexpected shape {w.shape}")
            weights.update({f"{base}.weight": w, f"{base}.scales": s, f"{base}.biases": b})
            per_layer[base] = {"group_size": 32, "bits": bits}
            bits_count[bits] = bits_count.get(bits, 0) + t.nbytes
        else:
            weights[f"{base}.weight"] = _float_tensor(g, t)
    del loaded
    if per_layer:
        # the most common bit width is the default; the others are named per module
        bits = max(bits_count, key=lambda k: bits_count[k])
        quant: dict[str, Any] = {"group_size": 32, "bits": bits}
        quant.update({k: v for k, v in per_layer.items() if v["bits"] != bits})
        config["quantization"] = quant
        config["quantization_config"] = quant
    eos = [i for i in (g.metadata.get("tokenizer.ggml.eos_token_id"), g.metadata.get("tokenizer.ggml.eot_token_id"))
           if isinstance(i, int) and 0 <= i < config["vocab_size"]]
    if eos:
        config["eos_token_id"] = eos[0] if len(set(eos)) == 1 else sorted(set(eos))
    bos = g.metadata.get("tokenizer.ggml.bos_token_id")
    if isinstance(bos, int):
        config["bos_token_id"] = bos
    _check_cancel(cancel)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the model folder is not secret
        shards = _shards(weights, max_bytes=1 << 30)
        index: dict[str, str] = {}
        for i, shard in enumerate(shards):
            _check_cancel(cancel)
            report(0.2 + 0.7 * i / len(shards), f"writing weights ({i + 1}/{len(shards)})")
            fname = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            mx.save_safetensors(str(tmp / fname), shard, metadata={"format": "mlx"})
            index.update({k: fname for k in shard})
        if len(shards) > 1:
            (tmp / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}, indent=1))
        report(0.92, "writing tokenizer")
        tokenizer.save(str(tmp / "tokenizer.json"))
        (tmp / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        (tmp / "verbatim_import.json").write_text(json.dumps({
            "source": str(Path(path).resolve()),
            "name": _model_name(g),
            "converter_version": CONVERTER_VERSION,
            "gguf_version": g.version,
            "tensor_types": sorted({t.type_name for t in g.tensors.values()}),
        }, indent=2))
        _check_cancel(cancel)
        try:
            os.replace(tmp, out_dir)  # atomic: the folder appears complete or not at all
        except OSError:
            if not (out_dir / "config.json").is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # a concurrent import of the same file won
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    report(1.0, "done")
    return out_dir


def _shards(weights: dict[str, Any], max_bytes: int) -> list[dict[str, Any]]:
    shards: list[dict[str, Any]] = [{}]
    size = 0
    for k, v in weights.items():
        if size and size + v.nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = v
        size += v.nbytes
    return shards


def _model_name(g: GGUFFile) -> str:
    name = g.metadata.get("general.name")
    return name if isinstance(name, str) and name.strip() else g.path.stem


# --- cached import ---

def file_sha256(path: Path, progress: Optional[Progress] = None, cancel: Optional[CancelToken] = None,
                span: tuple[float, float] = (0.0, 1.0)) -> str:
    """Content hash of a file, read in 8 MiB blocks (cancellable, with progress)."""
    h = hashlib.sha256()
    total = max(path.stat().st_size, 1)
    done, shown = 0, -1.0
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            h.update(block)
            done += len(block)
            _check_cancel(cancel)
            if progress and done / total - shown >= 0.1:  # ~10 updates, whatever the size
                shown = done / total
                progress(span[0] + (span[1] - span[0]) * shown, "hashing")
    return h.hexdigest()


def import_gguf(path: Path | str, models_dir: Path | str, progress: Optional[Progress] = None,
                cancel: Optional[CancelToken] = None) -> Path:
    """Import `path` into `models_dir/<content hash>/`, converting only the first time.

    The folder name is the file's SHA-256 (plus the converter version), so the same file under
    another name or path reuses the import, and a changed file gets a new one.
    """
    from engine.models.key import (
        cached_file_hash,  # stat-keyed hash memo shared with model keys
    )

    path = Path(path)
    report = progress or (lambda f, m: None)
    if not path.is_file():
        raise GGUFError(f"no such file: {path}")
    info = read_gguf(path)  # cheap, and rejects garbage before we spend time hashing it
    report(0.0, "hashing")
    digest = cached_file_hash(path, lambda f, m: report(0.3 * f, m), cancel)
    out = Path(models_dir) / f"{digest[:24]}-v{CONVERTER_VERSION}"
    if (out / "config.json").is_file():
        report(1.0, "already imported")
        return out
    return convert(path, out, lambda f, m: report(0.3 + 0.7 * f, m), cancel, info)
