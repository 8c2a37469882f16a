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

# A template that reads what a request carries besides roles and contents: an option (with a default, as gpt-oss's does) and each message's name.
OPTIONS_TEMPLATE = (
    "<|im_start|>system\nReasoning: {{ reasoning_effort | default('medium') }}<|im_end|>\n"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}{% if message.name %} ({{ message.name }}){% endif %}{{ '\\n' }}"
    "{{ message['content'] }}<|im_end|>\n"
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


# A Qwen2.5-style template with tools (issue 30): the tools in the system turn, assistant tool
# calls as <tool_call>{"name": ..., "arguments": ...}</tool_call>, tool results as user turns in
# <tool_response>. mlx-lm infers its tool format from "<tool_call>" and "tool_call.name"
# (mlx_lm/tokenizer_utils.py: json_tools), as it does for the real Qwen templates.
QWEN_TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content }}{%- else %}You are a helpful assistant.{%- endif %}"
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) or "
    "(message.role == 'assistant' and not message.tool_calls) %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{%- elif message.role == 'assistant' %}<|im_start|>assistant"
    "{%- if message.content %}\n{{ message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}"
    "{%- set tool_call = tool_call.function %}{%- endif %}"
    "\n<tool_call>\n{\"name\": \"{{ tool_call.name }}\", \"arguments\": {{ tool_call.arguments | tojson }}}"
    "\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{%- endif %}"
    "\n<tool_response>\n{{ message.content }}\n</tool_response>"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)
TOOL_TOKENS = ["<tool_call>", "</tool_call>"]  # added, not special: as in Qwen's tokenizer.json
_TOOL_CORPUS = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',
    '{"city": "Rome", "temp": 21, "sunny": true, "note": "warm"}',
    "<tool_response>\n{\"temp\": 18}\n</tool_response>",
]
# Tiny Qwen2 (model_type qwen2) with that template: the tests' model whose family has a tool parser.
TOOL_FAMILY = {**_BASE, "model_type": "qwen2", "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
               "vocab_size": VOCAB_SIZE + 8}  # room for the added tool tokens


def build_tool_model(folder: Path | str, seed: int = 0, special: list[str] | None = None,
                     context: int | None = None) -> Path:
    """A random-weight tiny Qwen2 whose chat template takes tools (mlx-lm's json_tools format).
    `special`: more special tokens, after the tool-call markers (ids from VOCAB_SIZE + 2).
    `context`: its context length in tokens (max_position_embeddings; 4096 by default), e.g. long
    enough for an agent harness's system prompt and tools."""
    config = TOOL_FAMILY if context is None else {**TOOL_FAMILY, "max_position_embeddings": context}
    folder = build_model(folder, "llama", seed, _config=config)
    build_tokenizer(Path(folder), QWEN_TOOLS_TEMPLATE, TOOL_TOKENS, _CORPUS + _TOOL_CORPUS, special,
                    context or 4096)
    return Path(folder)


# An agent harness's model (tests/serve/test_harnesses.py, bench/harness_prefix.py): the tool model's
# template and tokenizer, a context long enough for Codex CLI's and Claude Code's first requests (~41k
# and ~50k characters of system prompt and tools: ~30k and ~36k tokens here) and Claude Code's
# max_tokens 32000, and one small layer: what the conformance runs check is the wire and the cache.
# With one layer a prefill computes keys and values only (nothing reads the layer's attention
# output before the last token), so those prompts cost about a second. A random-weight model ends
# a reply where it samples an end or turn token (3 of 520 ids: ~170 tokens on average).
# bench/harness_prefix.py asks for a deeper body, where prefill costs, and `trained`: a tokenizer
# trained on the recorded requests too (tests/clients/harnesses/*-first-request.json), so they take
# ~11k and ~14k tokens, about what a real model's tokenizer makes of them.
HARNESS_CONTEXT = 131072
HARNESS_FAMILY = {**TOOL_FAMILY, "hidden_size": 64, "num_hidden_layers": 1, "intermediate_size": 128,
                  "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 64,
                  "max_position_embeddings": HARNESS_CONTEXT}
TRAINED_VOCAB = 8192
HARNESS_REQUESTS = Path(__file__).resolve().parent / "clients" / "harnesses"


def _strings(value: Any) -> list[str]:
    """Every string inside a JSON value (a recorded request's texts, names, descriptions)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *_strings(v)]]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def build_harness_model(folder: Path | str, seed: int = 0, trained: bool = False, **shape: Any) -> Path:
    """A random-weight tiny Qwen2 for agent harnesses (see HARNESS_FAMILY; `shape`: config values
    to use instead, e.g. more layers; `trained`: the tokenizer trained on the harnesses' requests)."""
    config = {**HARNESS_FAMILY, **shape}
    corpus = _CORPUS + _TOOL_CORPUS
    vocab = VOCAB_SIZE
    if trained:
        corpus += [s for f in sorted(HARNESS_REQUESTS.glob("*-first-request.json"))
                   for s in _strings(json.loads(f.read_text())["body"])]
        vocab = TRAINED_VOCAB
        config["vocab_size"] = TRAINED_VOCAB + 8
    folder = build_model(folder, "llama", seed, _config=config)
    build_tokenizer(Path(folder), QWEN_TOOLS_TEMPLATE, TOOL_TOKENS, corpus, max_length=HARNESS_CONTEXT, vocab=vocab)
    return Path(folder)


def build_tokenizer(folder: Path, template: str = CHATML_TEMPLATE, added: list[str] | None = None,
                    corpus: list[str] | None = None, special: list[str] | None = None,
                    max_length: int = 4096, vocab: int = VOCAB_SIZE) -> None:
    """Train a small byte-level BPE on a fixed corpus and write HF tokenizer files (`added`:
    tokens added after training, not special, e.g. a template's tool-call markers; `special`:
    special tokens added after those)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((corpus or _CORPUS) * 4, trainer=trainer)
    if added:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    if special:
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "unk_token": None,
                "chat_template": template,
                "model_max_length": max_length,
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
    config = {**overrides.pop("_config", FAMILIES[family]), **overrides}
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


def build_templated_model(folder: Path, template: str) -> Path:
    """A tiny llama whose tokenizer carries `template` as its chat template."""
    build_model(folder, "llama")
    build_tokenizer(folder, template)
    return folder
