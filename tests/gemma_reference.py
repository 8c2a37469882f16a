"""An independent float64 numpy forward of a Gemma 3 GGUF, for checking the imported model.

Written from the Gemma 3 architecture, not from mlx-lm: weights dequantized by gguf-py straight
from the file (the stored norms are used as stored: llama.cpp already wrote them as 1 + w),
token embeddings scaled by sqrt(hidden) rounded to bfloat16 (as Gemma does), RMSNorm before and
after attention and MLP, q/k norms, rotate-half RoPE with the local base on sliding layers and the
global base on every `pattern`-th layer, a causal mask limited to the window on sliding layers,
GELU (tanh) gated MLP, tied output. Everything in float64.
"""

from __future__ import annotations

import mmap
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from engine.models.gguf.reader import GGUFFile, read_gguf

# A plain English paragraph for the logit and perplexity checks.
TEXT = ("The water cycle describes how water moves between the land, the oceans and the air. "
        "The sun heats water in oceans, lakes and rivers, and some of it evaporates into water vapour. "
        "As the warm, moist air rises, it cools, and the vapour condenses into tiny droplets that form clouds. "
        "When the droplets grow heavy enough, they fall back to the ground as rain, snow or hail. "
        "Some of this water flows over the surface into streams and rivers, which carry it back to the sea. "
        "The rest soaks into the soil, where it is taken up by plants or slowly moves through the ground as "
        "groundwater. Plants release water vapour through their leaves, a process called transpiration. "
        "In this way the same water is used again and again, and the total amount of water on Earth stays "
        "almost the same.")


def dequantize(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> np.ndarray:
    """A GGUF tensor's bytes as float32 values, dequantized by gguf-py (not by the engine)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    if ggml_type == 0:
        return raw.view(np.float32).reshape(shape).copy()
    rows = raw.reshape(int(np.prod(shape[:-1])) if len(shape) > 1 else 1, -1)
    return gguf_dequantize(rows, GGMLQuantizationType(ggml_type)).reshape(shape)


@contextmanager
def gguf_tensors(src: Path) -> Iterator[tuple[GGUFFile, Callable[[str], np.ndarray]]]:
    """The file's header and a reader of its tensors by name (float32, straight from the file)."""
    g = read_gguf(src)
    with open(src, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        def tensor(name: str) -> np.ndarray:
            t = g.tensors[name]
            return dequantize(np.frombuffer(mm, np.uint8, t.nbytes, t.offset), t.ggml_type, t.shape)

        yield g, tensor


def _bf16(x: float) -> float:
    """x rounded to bfloat16 (nearest, ties to even), as Gemma rounds its embedding scale."""
    u = np.array([x], np.float32).view(np.uint32)
    u = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return float(u.view(np.float32)[0])


def nll(logits: np.ndarray, ids: list[int]) -> float:
    """Mean negative log-likelihood (nats/token) of ids[1:] under logits[:-1]."""
    z = logits[:-1].astype(np.float64)
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(-logp[np.arange(len(ids) - 1), ids[1:]].mean())


def gemma3_logits(src: Path, ids: list[int], local_base: float = 10000.0, pattern: int = 6,
                  weights: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """Logits (len(ids), vocab) in float64. `weights`: tensors (by GGUF name, as stored) to use
    instead of the file's."""
    T = len(ids)
    with gguf_tensors(src) as (g, tensor):
        md = g.metadata
        a = "gemma3."
        heads, kv_heads = md[a + "attention.head_count"], md[a + "attention.head_count_kv"]
        hd, dim = md[a + "attention.key_length"], md[a + "embedding_length"]
        eps, window = float(md[a + "attention.layer_norm_rms_epsilon"]), md[a + "attention.sliding_window"]

        def W(name: str) -> np.ndarray:
            return (weights[name] if weights is not None and name in weights else tensor(name)).astype(np.float64)

        def rms(v: np.ndarray, w: np.ndarray) -> np.ndarray:
            return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * w

        def tables(theta: float) -> tuple[np.ndarray, np.ndarray]:
            ang = np.arange(T)[:, None] * theta ** (-np.arange(0, hd, 2) / hd)[None, :]
            return np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

        rope_tables = {True: tables(local_base), False: tables(float(md[a + "rope.freq_base"]))}
        i, j = np.arange(T)[:, None], np.arange(T)[None, :]
        masks = {False: np.where(j <= i, 0.0, -np.inf), True: np.where((j <= i) & (i - j < window), 0.0, -np.inf)}
        emb = W("token_embd.weight")
        x = emb[ids] * _bf16(np.sqrt(dim))
        for layer in range(md[a + "block_count"]):
            b = f"blk.{layer}."
            sliding = (layer + 1) % pattern != 0
            cos, sin = rope_tables[sliding]

            def rope(v: np.ndarray, cos: np.ndarray = cos, sin: np.ndarray = sin) -> np.ndarray:
                return v * cos + np.concatenate([-v[..., hd // 2:], v[..., :hd // 2]], -1) * sin

            h = rms(x, W(b + "attn_norm.weight"))
            q = (h @ W(b + "attn_q.weight").T).reshape(T, heads, hd).transpose(1, 0, 2)
            k = (h @ W(b + "attn_k.weight").T).reshape(T, kv_heads, hd).transpose(1, 0, 2)
            v = (h @ W(b + "attn_v.weight").T).reshape(T, kv_heads, hd).transpose(1, 0, 2)
            q, k = rope(rms(q, W(b + "attn_q_norm.weight"))), rope(rms(k, W(b + "attn_k_norm.weight")))
            k, v = np.repeat(k, heads // kv_heads, 0), np.repeat(v, heads // kv_heads, 0)
            s = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + masks[sliding]
            p = np.exp(s - s.max(-1, keepdims=True))
            o = ((p / p.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(T, heads * hd)
            x = x + rms(o @ W(b + "attn_output.weight").T, W(b + "post_attention_norm.weight"))
            h = rms(x, W(b + "ffn_norm.weight"))
            gate = h @ W(b + "ffn_gate.weight").T
            gelu = 0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate ** 3)))
            x = x + rms((gelu * (h @ W(b + "ffn_up.weight").T)) @ W(b + "ffn_down.weight").T,
                        W(b + "post_ffw_norm.weight"))
        return rms(x, W("output_norm.weight")) @ emb.T
