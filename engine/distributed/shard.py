"""Sharding a loaded mlx-lm model over the group: tensor-parallel where the model offers
`shard(group)`, pipeline where it offers only `model.model.pipeline(group)`.

`shard_model` returns the sharding's identity (it goes into the model key: a 2-way cache never
serves a 3-way run, a tensor-parallel one never a pipeline one) or raises `ShardError` naming
why the model cannot be split N ways.
"""

from __future__ import annotations

from typing import Any

from engine.errors import EngineError

# Model arguments that tensor parallelism divides by the world size (heads, MLP width).
_DIVIDED = ("num_attention_heads", "num_key_value_heads", "intermediate_size")


class ShardError(EngineError):
    """The model cannot be sharded over this many ranks."""


def sharding_kind(model: Any) -> str:
    """'tensor', 'pipeline', or '' when the model offers neither."""
    if callable(getattr(model, "shard", None)):
        return "tensor"
    if callable(getattr(getattr(model, "model", None), "pipeline", None)):
        return "pipeline"
    return ""


def check_shardable(model: Any, size: int) -> str:
    """The sharding to use for `size` ranks, or a ShardError saying why there is none."""
    kind = sharding_kind(model)
    model_type = getattr(getattr(model, "args", None), "model_type", type(model).__module__.split(".")[-1])
    if not kind:
        raise ShardError(f"the model type {model_type!r} cannot be sharded: mlx-lm gives it neither "
                         "tensor parallelism (shard) nor pipeline parallelism")
    if kind == "tensor":
        args = getattr(model, "args", None)
        for name in _DIVIDED:
            value = getattr(args, name, None)
            if isinstance(value, int) and value % size:
                raise ShardError(f"the model cannot be sharded {size} ways: {name} = {value} is not divisible "
                                 f"by {size} (use a world size that divides it)")
    else:
        layers = len(getattr(model.model, "layers", []))
        if layers < size:
            raise ShardError(f"the model cannot be pipelined over {size} ranks: it has only {layers} layers")
    return kind


def shard_model(model: Any, group: Any) -> dict[str, Any]:
    """Shard `model` in place over `group`; the sharding's identity for the model key."""
    size = group.size()
    if size == 1:
        return {}
    kind = check_shardable(model, size)
    if kind == "tensor":
        model.shard(group)
    else:
        model.model.pipeline(group)
    return {"sharding": kind, "world_size": size}
