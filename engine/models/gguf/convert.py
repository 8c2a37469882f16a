"""GGUF -> mlx-lm model folder: tensor mapping, config, tokenizer, and the cached import.

Tensors are read only after reader.py validated the file: quantized ones through `mx.load`
(which maps Q4_0 / Q4_1 / Q8_0 blocks one-to-one onto MLX affine triplets, group size 32), float
ones straight from the file (`mx.load` turns BF16 into F16, which overflows, and returns K-quants
as unverified F16, so we never let it see those).

llama architecture only: GGUF stores Q/K rows permuted for interleaved RoPE, which is exactly
mlx-lm's `rope_traditional: true`, so the weights are used as stored.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

import numpy as np

from engine.errors import GGUFError
from engine.models.gguf.reader import (
    QUANTIZED,
    SUPPORTED_TYPES,
    GGUFFile,
    TensorInfo,
    read_gguf,
)
from engine.types import CancelToken, Progress

CONVERTER_VERSION = 1  # bump when the produced folder changes: old imports are redone
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
    if cancel is not None:
        cancel.check("import cancelled")


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
