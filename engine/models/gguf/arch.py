"""Per-architecture tables: GGUF tensor names and metadata -> an mlx-lm model folder's config.

One `Arch` per supported `general.architecture`: the mlx-lm model it maps onto, the tensor-name
table (GGUF block tensor -> mlx-lm module path), how the weights differ from what mlx-lm expects
(llama's Q/K row order, Gemma's stored 1 + w norms), the config builder and the chat template
used when the file has none. Anything not in a table is refused with a GGUFError naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from engine.errors import GGUFError

Meta = dict[str, Any]

_LLAMA_LAYER = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_GEMMA3_LAYER = {
    **_LLAMA_LAYER, **_QK_NORMS,
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

# Chat templates for files that carry none (Jinja, as in tokenizer_config.json).
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
GEMMA_TURNS = (
    "{{ bos_token }}{% set sys = '' %}{% set msgs = messages %}"
    "{% if messages and messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] + '\n\n' %}"
    "{% set msgs = messages[1:] %}{% endif %}"
    "{% for m in msgs %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ (sys if loop.first else '') + m['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
PLAIN = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
         "{% if add_generation_prompt %}assistant:{% endif %}")


def meta_int(md: Meta, key: str, default: Optional[int] = None) -> int:
    v = md.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
        if v is None:
            raise GGUFError(f"missing {key} in the metadata")
        raise GGUFError(f"invalid {key} = {v!r} (expected one positive integer)")
    return int(v)


def meta_float(md: Meta, key: str, default: float) -> float:
    """A float32 metadata value as the short decimal it was written from (1e-06, not 9.99e-07)."""
    v = md.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float, np.floating)) or not np.isfinite(v) or v <= 0:
        raise GGUFError(f"invalid {key} = {v!r} (expected one positive number)")
    return float(str(np.float32(v)))


@dataclass(frozen=True)
class Arch:
    name: str  # general.architecture
    model_type: str  # mlx-lm model_type
    layer_names: dict[str, str]  # GGUF block tensor (blk.N.<key>) -> mlx-lm path in layer N
    config: Callable[[str, Meta, "Dims"], dict[str, Any]]  # the architecture-specific fields
    chat_template: tuple[str, str]  # (label, Jinja) used when the file has no template
    rope_traditional: bool = False  # llama's GGUF Q/K rows are permuted for interleaved RoPE
    norm_shift: float = 0.0  # added to every *_norm weight (Gemma: llama.cpp stores 1 + w)
    biases: frozenset[str] = field(default_factory=frozenset)  # layer tensors allowed a .bias


@dataclass(frozen=True)
class Dims:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int


def _dims(arch: str, md: Meta) -> Dims:
    hidden = meta_int(md, f"{arch}.embedding_length")
    heads = meta_int(md, f"{arch}.attention.head_count")
    kv_heads = meta_int(md, f"{arch}.attention.head_count_kv", heads)
    if heads % kv_heads:
        raise GGUFError(f"invalid head counts: {heads} query heads, {kv_heads} kv heads")
    head_dim = meta_int(md, f"{arch}.attention.key_length", hidden // heads if hidden % heads == 0 else None)
    if meta_int(md, f"{arch}.attention.value_length", head_dim) != head_dim:
        raise GGUFError("unsupported: value heads of another size than key heads")
    rope_dim = meta_int(md, f"{arch}.rope.dimension_count", head_dim)
    if rope_dim != head_dim:
        raise GGUFError(f"unsupported: partial rotary embedding ({rope_dim} of {head_dim} dims)")
    if md.get(f"{arch}.expert_count", 0):
        raise GGUFError(f"unsupported: mixture-of-experts {arch} models")
    tokens = md.get("tokenizer.ggml.tokens")
    vocab = len(tokens) if isinstance(tokens, list) else meta_int(md, f"{arch}.vocab_size")
    return Dims(hidden, meta_int(md, f"{arch}.block_count"), heads, kv_heads, head_dim, vocab)


def _rope_scaling(arch: str, md: Meta) -> Optional[dict[str, Any]]:
    scaling = md.get(f"{arch}.rope.scaling.type")
    if scaling in (None, "none"):
        return None
    factor = md.get(f"{arch}.rope.scaling.factor")
    if scaling != "linear" or isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 0:
        raise GGUFError(f"unsupported RoPE scaling {scaling!r}")
    return {"type": "linear", "rope_type": "linear", "factor": float(factor)}


def _common(arch: str, md: Meta, d: Dims, theta: float) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "hidden_size": d.hidden, "num_hidden_layers": d.layers,
        "intermediate_size": meta_int(md, f"{arch}.feed_forward_length"),
        "num_attention_heads": d.heads, "num_key_value_heads": d.kv_heads, "head_dim": d.head_dim,
        "rms_norm_eps": meta_float(md, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": meta_float(md, f"{arch}.rope.freq_base", theta),
        "max_position_embeddings": meta_int(md, f"{arch}.context_length", 4096),
        "vocab_size": d.vocab,
    }
    scaling = _rope_scaling(arch, md)
    if scaling:
        cfg["rope_scaling"] = scaling
    return cfg


def _llama(arch: str, md: Meta, d: Dims) -> dict[str, Any]:
    return {**_common(arch, md, d, 10000.0), "attention_bias": False, "mlp_bias": False}


def _qwen2(arch: str, md: Meta, d: Dims) -> dict[str, Any]:
    if d.head_dim * d.heads != d.hidden:
        raise GGUFError(f"unsupported: qwen2 with head size {d.head_dim} != hidden / heads")
    return _common(arch, md, d, 1e6)


def _qwen3(arch: str, md: Meta, d: Dims) -> dict[str, Any]:
    return _common(arch, md, d, 1e6)


def _gemma3(arch: str, md: Meta, d: Dims) -> dict[str, Any]:
    cfg = _common(arch, md, d, 1e6)
    cfg["rms_norm_eps"] = meta_float(md, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    cfg["sliding_window"] = meta_int(md, f"{arch}.attention.sliding_window", 512)
    # llama.cpp fixes Gemma 3's pattern (5 sliding layers, then a global one) and the local
    # RoPE base in code; newer files may carry them as metadata.
    cfg["sliding_window_pattern"] = meta_int(md, f"{arch}.attention.sliding_window_pattern", 6)
    cfg["rope_local_base_freq"] = meta_float(md, f"{arch}.rope.freq_base_swa", 10000.0)
    # queries are scaled by 1/sqrt(head_dim), except the 27B model (hidden / heads), as llama.cpp
    big = d.layers == 62 and d.hidden == 5376
    cfg["query_pre_attn_scalar"] = d.hidden // d.heads if big else d.head_dim
    return cfg


ARCHITECTURES: dict[str, Arch] = {
    "llama": Arch("llama", "llama", _LLAMA_LAYER, _llama, ("plain", PLAIN), rope_traditional=True),
    "qwen2": Arch("qwen2", "qwen2", _LLAMA_LAYER, _qwen2, ("chatml", CHATML),
                  biases=frozenset({"attn_q", "attn_k", "attn_v"})),
    "qwen3": Arch("qwen3", "qwen3", {**_LLAMA_LAYER, **_QK_NORMS}, _qwen3, ("chatml", CHATML)),
    "gemma3": Arch("gemma3", "gemma3_text", _GEMMA3_LAYER, _gemma3, ("gemma", GEMMA_TURNS), norm_shift=-1.0),
}
SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURES)


def get_arch(name: str) -> Arch:
    if name not in ARCHITECTURES:
        raise GGUFError(f"unsupported architecture {name!r} (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    return ARCHITECTURES[name]


def build_config(arch: Arch, md: Meta, tensor_names: set[str]) -> dict[str, Any]:
    """The mlx-lm config.json (without the quantization section) for this architecture."""
    d = _dims(arch.name, md)
    cfg = {"model_type": arch.model_type, **arch.config(arch.name, md, d)}
    cfg["tie_word_embeddings"] = "output.weight" not in tensor_names
    if arch.rope_traditional:
        cfg["rope_traditional"] = True  # GGUF's Q/K row order is the interleaved RoPE layout
    return cfg


def mlx_name(arch: Arch, gguf_name: str, n_layers: int) -> tuple[str, bool]:
    """GGUF tensor name -> (mlx-lm parameter path, is a norm weight); GGUFError if unknown."""
    stem, _, suffix = gguf_name.rpartition(".")
    if suffix not in ("weight", "bias"):
        raise GGUFError(f"unsupported tensor {gguf_name!r} for the {arch.name} architecture")
    if stem in _GLOBAL and suffix == "weight":
        return f"{_GLOBAL[stem]}.weight", stem == "output_norm"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in arch.layer_names:
        key = parts[2]
        if int(parts[1]) >= n_layers:
            raise GGUFError(f"tensor {gguf_name!r} is beyond block_count {n_layers}")
        if suffix == "bias" and key not in arch.biases:
            raise GGUFError(f"unsupported tensor {gguf_name!r} for the {arch.name} architecture")
        return f"model.layers.{int(parts[1])}.{arch.layer_names[key]}.{suffix}", key.endswith("norm")
    if stem == "rope_freqs":
        raise GGUFError("unsupported: Llama 3.1-style RoPE frequency scaling (rope_freqs tensor)")
    if "_exps" in stem or "ffn_gate_inp" in stem:
        raise GGUFError(f"unsupported: mixture-of-experts {arch.name} models")
    raise GGUFError(f"unsupported tensor {gguf_name!r} for the {arch.name} architecture")


def required_tensors(arch: Arch, n_layers: int) -> list[str]:
    """GGUF tensors every model of this architecture has (mlx-lm cannot load one without them)."""
    names = ["token_embd.weight", "output_norm.weight"]
    for i in range(n_layers):
        names += [f"blk.{i}.{key}.weight" for key in arch.layer_names]
        names += [f"blk.{i}.{key}.bias" for key in sorted(arch.biases)]
    return names


def expected_shape(mlx_path: str, cfg: dict[str, Any]) -> tuple[int, ...]:
    """The shape (numpy order) mlx-lm's model has for this parameter, from the config."""
    h, hd, ffn, vocab = cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"], cfg["vocab_size"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    module, _, suffix = mlx_path.rpartition(".")
    leaf = module.rpartition(".")[2]
    shapes = {"embed_tokens": (vocab, h), "lm_head": (vocab, h), "q_proj": (q, h), "k_proj": (kv, h),
              "v_proj": (kv, h), "o_proj": (h, q), "gate_proj": (ffn, h), "up_proj": (ffn, h),
              "down_proj": (h, ffn), "q_norm": (hd,), "k_norm": (hd,)}
    shape = shapes.get(leaf, (h,))  # every other parameter is a norm over the hidden size
    return shape[:1] if suffix == "bias" else shape
