"""A model ready to generate (`LoadedModel`): its weights, tokenizer and identity, created on the
worker thread that will use it (MLX streams are thread-local), and the sizes of its vocabulary."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from mlx_lm.models.cache import make_prompt_cache

from engine.cache.families import quantized_cache


@dataclass
class LoadedModel:
    """A model ready to generate: created on the worker thread that will use it."""

    model: Any
    tokenizer: Any
    path: str
    name: str
    key: str  # model identity + every cache-affecting option; snapshots never cross keys
    kv_bits: Optional[int] = None
    kv_group_size: int = 64
    eos_ids: set[int] = field(default_factory=set)

    def new_cache(self) -> list[Any]:
        cache = make_prompt_cache(self.model)
        if self.kv_bits:
            cache = quantized_cache(cache, self.kv_group_size, self.kv_bits)
        return cache

    @property
    def vocab_size(self) -> int:
        """Width of the model's logits (the output layer may be padded past the tokenizer's size)."""
        n = getattr(getattr(self.model, "args", None), "vocab_size", None)
        return int(n) if isinstance(n, int) and n > 0 else len(self.tokenizer.get_vocab())

    @property
    def named_tokens(self) -> int:
        """Token ids a request may name (logit_bias): the tokenizer's, its base vocabulary and
        added tokens, as /verbatim/tokenize counts them, never past the logits' width. The ids in
        an output layer padded past the tokenizer decode to no text."""
        inner = getattr(self.tokenizer, "_tokenizer", self.tokenizer)
        try:
            named = len(inner)
        except TypeError:
            named = len(self.tokenizer.get_vocab())
        return min(named, self.vocab_size)
