"""Tiny random-weight MLX model folders for tests and benchmarks.

No hub access is possible on CI, so the test suite builds its own models: real mlx-lm
architectures (one per cache family), random f32 weights, a small byte-level BPE tokenizer
trained on a fixed corpus, and a ChatML chat template. Every folder is a normal mlx-lm
model folder (config.json, model.safetensors, tokenizer.json, tokenizer_config.json).

Hidden size 256 and f32 on purpose: smaller or bf16 models hide the forward-width effect
that the exact-mode tests must be able to see (docs/testing.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Why is the sky blue? Because of Rayleigh scattering of sunlight in the atmosphere.",
    "Explain how a prompt cache works in two sentences.",
    "The capital of France is Paris. The capital of Italy is Rome.",
    "def add(a, b):\n    return a + b\n",
    "Regenerate the answer, please. Same seed, same settings, same tokens.",
    "user assistant system: You are a helpful assistant. Answer briefly.",
    "0123456789 +-*/=()[]{}<>.,;:!?'\"#@$%^&_|~`",
    "Ünïcödé, 日本語, emoji 🙂 and accents: café, naïve, señor.",
]

VOCAB_SIZE = 512

_BASE = {
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}

# One config per cache family. "kvquant" is llama with the engine's KV quantization on,
# which the engine reads from the folder's verbatim.json (a cache-affecting option).
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {**_BASE, "model_type": "llama", "rms_norm_eps": 1e-5, "rope_theta": 10000.0},
    "gemma3": {
        **_BASE,
        "model_type": "gemma3_text",
        "rms_norm_eps": 1e-6,
        "num_hidden_layers": 4,
        "sliding_window": 24,
        "sliding_window_pattern": 2,
        "query_pre_attn_scalar": 64,
        "rope_theta": 10000.0,
        "rope_local_base_freq": 10000.0,
    },
    "lfm2": {
        **_BASE,
        "model_type": "lfm2",
        "norm_eps": 1e-5,
        "conv_bias": False,
        "conv_L_cache": 3,
        "block_dim": 256,
        "block_ff_dim": 512,
        "block_multiple_of": 64,
        "block_ffn_dim_multiplier": 1.0,
        "block_auto_adjust_ff_dim": False,
        "full_attn_idxs": [1, 3],
        "rope_theta": 10000.0,
    },
    "kvquant": {**_BASE, "model_type": "llama", "rms_norm_eps": 1e-5, "rope_theta": 10000.0},
}

ENGINE_OPTIONS: dict[str, dict[str, Any]] = {"kvquant": {"kv_bits": 8, "kv_group_size": 64}}


def build_tokenizer(folder: Path) -> None:
    """Train a small byte-level BPE on a fixed corpus and write HF tokenizer files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "unk_token": None,
                "chat_template": CHATML_TEMPLATE,
                "model_max_length": 4096,
            },
            indent=2,
        )
    )


def build_model(folder: Path | str, family: str = "llama", seed: int = 0, quantize_bits: int | None = None,
                **overrides: Any) -> Path:
    """Write a random-weight model folder of `family` to `folder` (idempotent) and return it.

    `quantize_bits`: store the weights MLX-quantized (affine, group size 64), as mlx-community
    4-bit models are."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten, tree_map
    from mlx_lm.utils import _get_classes

    folder = Path(folder)
    config = {**FAMILIES[family], **overrides}
    if quantize_bits:
        config["quantization"] = {"group_size": 64, "bits": quantize_bits}
    marker = folder / "config.json"
    if marker.exists() and json.loads(marker.read_text()) == config:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    model.update(tree_map(lambda a: a.astype(mx.float32), model.parameters()))
    if quantize_bits:
        nn.quantize(model, group_size=64, bits=quantize_bits)
    weights = dict(tree_flatten(model.parameters()))
    if hasattr(model, "sanitize"):
        weights = model.sanitize(weights)
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})
    if family in ENGINE_OPTIONS:
        (folder / "verbatim.json").write_text(json.dumps(ENGINE_OPTIONS[family]))
    build_tokenizer(folder)
    marker.write_text(json.dumps(config, indent=2))
    return folder
