"""K-quant GGUFs of every supported architecture: synthetic files, imported, loaded and run.

Each architecture gets a 2-layer random model (tests/gguf_fixtures.synthetic_gguf) whose
matrices are K-quant blocks (Q2_K..Q6_K, plus a Q8_0 from gguf-py's own quantizer), written
with gguf-py's GGUFWriter: llama (Q/K rows permuted as llama.cpp writes them, untied output),
qwen2 (q/k/v biases), qwen3 (q/k norms), gemma3 (norms stored as 1 + w, a sliding window of 8
tokens under a longer prompt, SentencePiece tokenizer). For each: the weights in the imported
folder against gguf-py's dequantization, a forward against an independent float64 numpy
forward, and generation through the Engine (a regenerate restores prompt - 1 and is identical).
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from engine.models.gguf.convert import convert
from engine.models.gguf.reader import read_gguf
from tests import gguf_fixtures as gf
from tests.engine_helpers import cold_request, make_engine, request
from tests.gemma_reference import dequantize, gemma3_logits, gguf_tensors

ARCHS = list(gf.SYNTHETIC)
K_TYPES = [gf.T_Q2_K, gf.T_Q3_K, gf.T_Q4_K, gf.T_Q5_K, gf.T_Q6_K]
# What the importer must make of each source type: the linear-grid types are carried over
# exactly (4-bit sources as 4 bits, 5- and 8-bit ones as 8), the others requantized to 8 bits.
HOW = {"Q4_K": "4-bit exact", "Q5_K": "8-bit exact", "Q8_0": "8-bit exact",
       "Q2_K": "8-bit requantized", "Q3_K": "8-bit requantized", "Q6_K": "8-bit requantized"}
# GGUF block tensor -> mlx-lm module (written here, not taken from the importer's table)
LAYER = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
         "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj",
         "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj", "attn_q_norm": "self_attn.q_norm",
         "attn_k_norm": "self_attn.k_norm", "post_attention_norm": "post_attention_layernorm",
         "post_ffw_norm": "post_feedforward_layernorm"}
TEXT = "The capital of France is Paris. Why is the sky blue? The water cycle moves water between land and air."


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERBATIM_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module", params=ARCHS)
def imported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    """(architecture, the synthetic GGUF, its imported folder)."""
    arch = request.param
    root = tmp_path_factory.mktemp(arch)
    src = gf.synthetic_gguf(root / f"{arch}.gguf", arch, seed=ARCHS.index(arch))
    return arch, src, convert(src, root / "out")


# --- the K-quant blocks themselves ---

@pytest.mark.parametrize("ttype", K_TYPES)
def test_kquant_blocks_dequantize_as_intended(ttype: int) -> None:
    """The fixture's blocks hold exactly the values it meant (bit packing checked by gguf-py),
    and those are a quantization of the input (not arbitrary bytes)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    rng = np.random.default_rng(ttype)
    w = (rng.standard_normal((4, 512)) * 0.3 + 0.05).astype(np.float32)
    w[0, :256] = 0.0  # an all-zero super-block: scales of zero must not divide by zero
    raw, want = gf.kquantize(w, ttype)
    assert len(raw) == w.size // 256 * GGML_QUANT_SIZES[GGMLQuantizationType(ttype)][1]
    got = dequantize(np.frombuffer(raw, np.uint8), ttype, w.shape)
    assert np.array_equal(got, want)
    assert not want[0, :256].any()
    # worst error as a fraction of the largest magnitude: ~half a step of each type's grid
    bound = {gf.T_Q2_K: 0.3, gf.T_Q3_K: 0.2, gf.T_Q4_K: 0.07, gf.T_Q5_K: 0.035, gf.T_Q6_K: 0.025}[ttype]
    assert np.abs(want - w).max() <= bound * np.abs(w).max()


# --- synthetic models of each architecture ---

def test_kquant_weights_equal_gguf_py_dequantization(imported: tuple[str, Path, Path]) -> None:
    arch, src, folder = imported
    cfg = json.loads((folder / "config.json").read_text())
    g = read_gguf(src)
    types = {t.type_name for t in g.tensors.values()} - {"F32"}
    assert {k: v for k, v in cfg["verbatim_gguf"]["tensors"].items() if k != "F32"} == {t: [HOW[t]] for t in types}
    quant = cfg["quantization"]
    have_w = mx.load(str(folder / "model.safetensors"))
    shift = -1.0 if arch == "gemma3" else 0.0
    with gguf_tensors(src) as (_, tensor):
        for t in g.tensors.values():
            want = tensor(t.name)
            module = _module(arch, t.name)
            if t.name.endswith(".bias") or t.ggml_type == gf.T_F32:
                suffix = "bias" if t.name.endswith(".bias") else "weight"
                if "norm" in t.name:
                    want = want + np.float32(shift)  # llama.cpp's 1 + w back to mlx-lm's w
                assert np.array_equal(np.array(have_w[f"{module}.{suffix}"]), want), t.name
                continue
            have = _dequantized(have_w, quant, module)
            if HOW[t.type_name].endswith("exact"):
                assert np.array_equal(have, want), t.name
            else:
                # 8-bit affine over 32 values: MLX anchors the grid at the group's edge farthest
                # from zero, so the far edge may be clipped by up to a step: one step is the bound
                groups = want.reshape(-1, 32)
                step = (groups.max(1) - groups.min(1))[:, None] / 255
                err = np.abs(have.reshape(-1, 32) - groups)
                assert (err <= step * 1.001 + 1e-7).all(), (t.name, float((err / step).max()))


def _module(arch: str, gguf_name: str) -> str:
    """GGUF tensor name -> the mlx-lm module holding it."""
    stem = gguf_name.removesuffix(".weight").removesuffix(".bias")
    parts = stem.split(".")
    if len(parts) == 1:
        return {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}[stem]
    layer = {**LAYER, "ffn_norm": "pre_feedforward_layernorm" if arch == "gemma3" else "post_attention_layernorm"}
    return f"model.layers.{parts[1]}.{layer[parts[2]]}"


def _dequantized(weights: dict[str, mx.array], quant: dict, module: str) -> np.ndarray:
    bits = quant.get(module, {}).get("bits", quant["bits"])
    w, s, b = (weights[f"{module}.{k}"] for k in ("weight", "scales", "biases"))
    return np.array(mx.dequantize(w, s, b, group_size=32, bits=bits))


def _as_imported(arch: str, src: Path, folder: Path) -> dict[str, np.ndarray]:
    """The requantized tensors as the imported folder holds them, by GGUF name (every other
    tensor equals the file's: test_kquant_weights_equal_gguf_py_dequantization)."""
    quant = json.loads((folder / "config.json").read_text())["quantization"]
    weights = mx.load(str(folder / "model.safetensors"))
    return {t.name: _dequantized(weights, quant, _module(arch, t.name))
            for t in read_gguf(src).tensors.values() if HOW.get(t.type_name, "").endswith("requantized")}


def _llama_family_logits(src: Path, ids: list[int], weights: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """Independent float64 forward of a llama / qwen2 / qwen3 GGUF: weights dequantized by
    gguf-py straight from the file; llama's Q/K rows are in GGUF's interleaved order, so its
    RoPE rotates adjacent pairs; qwen's rotates halves (NEOX); qwen2 adds q/k/v biases, qwen3
    normalizes each head's q and k. `weights`: tensors (by GGUF name) to use instead of the file's."""
    T = len(ids)
    with gguf_tensors(src) as (g, tensor):
        md = g.metadata
        arch = md["general.architecture"]
        a = arch + "."
        heads, kv_heads, hd = md[a + "attention.head_count"], md[a + "attention.head_count_kv"], md[a + "attention.key_length"]
        eps, theta = float(md[a + "attention.layer_norm_rms_epsilon"]), float(md[a + "rope.freq_base"])

        def W(name: str) -> np.ndarray:
            return (weights[name] if weights is not None and name in weights else tensor(name)).astype(np.float64)

        def rms(v: np.ndarray, w: np.ndarray) -> np.ndarray:
            return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * w

        ang = np.arange(T)[:, None] * theta ** (-np.arange(0, hd, 2) / hd)[None, :]  # (T, hd/2)
        cos, sin = np.cos(ang), np.sin(ang)

        def rope(v: np.ndarray) -> np.ndarray:  # (heads, T, hd)
            if arch == "llama":  # pairs (0, 1), (2, 3), ...
                x0, x1 = v[..., 0::2], v[..., 1::2]
                out = np.empty_like(v)
                out[..., 0::2], out[..., 1::2] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
                return out
            x0, x1 = v[..., :hd // 2], v[..., hd // 2:]  # pairs (i, i + hd/2)
            return np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1)

        def proj(h: np.ndarray, b: str, kind: str, n: int) -> np.ndarray:
            y = h @ W(f"{b}{kind}.weight").T
            if f"{b}{kind}.bias" in g.tensors:
                y = y + W(f"{b}{kind}.bias")
            return y.reshape(T, n, hd).transpose(1, 0, 2)

        mask = np.triu(np.full((T, T), -np.inf), 1)
        emb = W("token_embd.weight")
        x = emb[ids]
        for layer in range(md[a + "block_count"]):
            b = f"blk.{layer}."
            h = rms(x, W(b + "attn_norm.weight"))
            q, k, v = proj(h, b, "attn_q", heads), proj(h, b, "attn_k", kv_heads), proj(h, b, "attn_v", kv_heads)
            if b + "attn_q_norm.weight" in g.tensors:
                q, k = rms(q, W(b + "attn_q_norm.weight")), rms(k, W(b + "attn_k_norm.weight"))
            q, k = rope(q), rope(k)
            k, v = np.repeat(k, heads // kv_heads, 0), np.repeat(v, heads // kv_heads, 0)
            s = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + mask
            p = np.exp(s - s.max(-1, keepdims=True))
            o = ((p / p.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(T, heads * hd)
            x = x + o @ W(b + "attn_output.weight").T
            h = rms(x, W(b + "ffn_norm.weight"))
            gate = h @ W(b + "ffn_gate.weight").T
            x = x + (gate / (1 + np.exp(-gate)) * (h @ W(b + "ffn_up.weight").T)) @ W(b + "ffn_down.weight").T
        out = W("output.weight") if "output.weight" in g.tensors else emb
        return rms(x, W("output_norm.weight")) @ out.T


def _reference(arch: str, src: Path, ids: list[int], weights: dict[str, np.ndarray] | None = None,
               window: bool = True) -> np.ndarray:
    if arch == "gemma3":  # pattern 2: layer 0 slides over 8 tokens, layer 1 is global
        return gemma3_logits(src, ids, pattern=2 if window else 1 << 30, weights=weights)
    return _llama_family_logits(src, ids, weights)


def test_kquant_forward_matches_numpy_reference(imported: tuple[str, Path, Path]) -> None:
    from mlx_lm import load

    arch, src, folder = imported
    model, tok = load(str(folder))
    ids = tok.encode(TEXT)
    assert len(ids) > 2 * gf.GEMMA_WINDOW
    got = np.array(model(mx.array([ids]))[0].astype(mx.float32)).astype(np.float64)
    ref = _reference(arch, src, ids)  # the file's weights
    same = _reference(arch, src, ids, _as_imported(arch, src, folder))  # the requantized ones as imported
    scale = np.abs(ref).max()
    err, err_same = np.abs(got - ref).max() / scale, np.abs(got - same).max() / scale
    print(f"{arch}: {len(ids)} tokens, relative max logit error {err:.3g} against the float64 reference "
          f"on the file's weights, {err_same:.3g} on the imported ones")
    # the forward itself: float32 against float64 on the same weights
    assert err_same < 1e-5, f"{arch}: relative max logit error {err_same:.3g}"
    # and the file's model: plus the 8-bit requantization of its Q2_K/Q3_K/Q6_K tensors
    assert err < 1e-2, f"{arch}: relative max logit error {err:.3g}"
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.9
    if arch == "gemma3":  # control: the window matters for this prompt, and the import honours it
        unwindowed = _reference(arch, src, ids, _as_imported(arch, src, folder), window=False)
        assert np.abs(unwindowed - same).max() / scale > 100 * err_same


def test_kquant_generates_and_regenerates_exactly(imported: tuple[str, Path, Path]) -> None:
    arch, _, folder = imported
    eng = make_engine(folder)
    req = request([{"role": "user", "content": TEXT}], max_tokens=8, temperature=0.0, seed=0)
    cold = eng.generate(cold_request(req))
    first, again = eng.generate(req), eng.generate(req)
    n = again.report.prompt_tokens
    assert n > gf.GEMMA_WINDOW and len(cold.tokens) > 0
    for r in (first, again):
        assert r.tokens == cold.tokens and r.logprobs == cold.logprobs, arch
    assert again.report.restored == n - 1 and again.report.source == "memory"
    assert again.report.layer_offsets == [n - 1] * gf.LAYERS
