"""Promises around the cache core that a deliberate bug must not slip past (issue 22), each
checked on the most public surface that shows it: `python -m engine` in a subprocess, the
server through the real openai client, the Engine API. Each test names the mutation of
tests/mutation_check.py it catches.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
import mlx.core as mx
import pytest

from engine import receipts
from engine.engine import Engine
from engine.errors import ContextLengthError
from engine.receipts import ReceiptModel
from engine.types import GenerationRequest, SamplerSettings
from tests.engine_helpers import flip_low_bit, make_engine, request
from tests.cli_helpers import run_cli, write
from tests.server_helpers import Server
from tests.tiny_models import VOCAB_SIZE, build_model

SKY = [{"role": "user", "content": "Why is the sky blue?"}]


# -- mutation "verify ignores the logprobs digest" ----------------------------------------------


def test_verify_fails_when_only_one_logprobs_low_bit_differs(tiny_model: Path, tmp_path: Path) -> None:
    """Same tokens, one logprob off by one float32 ulp (its SHA-256 recomputed, so the file is
    consistent): `engine verify` exits 1 and names the index; without the logprobs listed, the
    digest alone still decides."""
    eng = make_engine(tiny_model)
    req = request(SKY, max_tokens=12, temperature=0.9, seed=5)
    result = eng.generate(req)
    receipt = receipts.build(req, result, ReceiptModel(str(tiny_model), eng.info.key, eng.info.name,
                                                       eng.info.dequantized), eng.chunk)
    eng.close()
    k = 7
    lps = list(receipt.logprobs)
    lps[k] = flip_low_bit(lps[k])
    assert lps[k] != receipt.logprobs[k] and abs(lps[k] - receipt.logprobs[k]) < 1e-5
    edited = dataclasses.replace(receipt, logprobs=lps, logprobs_sha256=receipts.logprobs_sha256(lps))
    receipts.write(edited, tmp_path / "edited.json")
    proc = run_cli("verify", str(tmp_path / "edited.json"), "--no-cache", check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"MISMATCH: same 12 tokens, logprobs differ from index {k} "), proc.stdout

    doc = json.loads((tmp_path / "edited.json").read_text())
    del doc["logprobs"]  # only the digest is left to tell
    (tmp_path / "digest-only.json").write_text(json.dumps(doc))
    proc = run_cli("verify", str(tmp_path / "digest-only.json"), "--no-cache", "--json", check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdict = json.loads(proc.stdout)
    assert verdict["ok"] is False and verdict["tokens"] == receipt.tokens
    assert verdict["logprobs_sha256"] == receipt.logprobs_sha256 != doc["logprobs_sha256"]


# -- mutation "cached_tokens reports the matched prefix" ------------------------------------------


def test_server_cached_tokens_is_what_was_restored_not_what_matched(tiny_model: Path) -> None:
    """Exact mode restores at the last cut the two prompts share: before the end of the match.
    `usage.prompt_tokens_details.cached_tokens` is what was restored (streamed or not)."""
    s = Server(tiny_model, None, chunk=8)
    prompts = [[{"role": "user", "content": f"Why is the sky blue? Because of Rayleigh scattering {end}"}]
               for end in ("of sunlight.", "of moonlight.", "of sunlight, mostly.")]
    try:
        c = s.client()
        c.chat.completions.create(model=s.model, messages=prompts[0], max_tokens=4, temperature=0)
        full = c.chat.completions.create(model=s.model, messages=prompts[1], max_tokens=4, temperature=0)
        chunks = list(c.chat.completions.create(model=s.model, messages=prompts[2], max_tokens=4, temperature=0,
                                                stream=True, stream_options={"include_usage": True}))
    finally:
        s.close()
    v = full.verbatim
    assert v["mode"] == "exact" and 0 < v["restored"] < v["matched"], v
    assert full.usage.prompt_tokens_details.cached_tokens == v["restored"]
    v = next(ch for ch in chunks if ch.choices and ch.choices[0].finish_reason is not None).verbatim
    assert 0 < v["restored"] < v["matched"], v
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == v["restored"]


# -- mutations "memory tier returns any model's snapshots", "kv group size out of the model key" ---


def test_two_models_in_one_engine_never_share_snapshots(tiny_model: Path, tmp_path: Path) -> None:
    """Load A, generate; load B (other weights, the same tokenizer), the same prompt: B restores
    nothing and equals its own cold run; A, loaded again, still finds its snapshots."""
    other = build_model(tmp_path / "llama-b", "llama", seed=1)
    eng = Engine(use_disk=False, chunk=8)
    req = request(SKY, max_tokens=8)
    eng.load(str(tiny_model))
    a = eng.generate(req)
    info_b = eng.load(str(other))
    assert info_b.key != a.report.model_key
    assert eng.prompt_ids(SKY) == a.prompt_ids  # the same tokenizer: the same prompt tokens
    b = eng.generate(req)
    assert (b.report.restored, b.report.matched, b.report.source) == (0, 0, None)
    cold = eng.generate(dataclasses.replace(req, use_cache=False))
    assert (b.tokens, b.logprobs) == (cold.tokens, cold.logprobs)
    eng.load(str(tiny_model))
    again = eng.generate(req)
    assert again.report.restored == len(a.prompt_ids) - 1 and again.report.source == "memory"
    eng.close()


def test_kv_group_sizes_in_one_cache_dir_never_share_snapshots(tmp_path: Path) -> None:
    """Two folders that differ only in the KV-quantization group size (verbatim.json): other keys,
    so the second restores nothing from the first's snapshots on disk, then its own."""
    g64 = build_model(tmp_path / "kv64", "kvquant")
    g32 = tmp_path / "kv32"
    shutil.copytree(g64, g32)
    (g32 / "verbatim.json").write_text(json.dumps({"kv_bits": 8, "kv_group_size": 32}))
    cache = tmp_path / "cache"
    req = request(SKY, max_tokens=6)
    a = Engine(cache_dir=cache, chunk=8)
    info_a = a.load(str(g64))
    a.generate(req)
    a.close()
    b = Engine(cache_dir=cache, chunk=8)
    info_b = b.load(str(g32))
    try:
        assert info_a.key != info_b.key
        first = b.generate(req)
        assert (first.report.restored, first.report.matched, first.report.source) == (0, 0, None)
        second = b.generate(req)
        assert second.report.restored == len(second.prompt_ids) - 1  # its own snapshots do serve it
    finally:
        b.close()


# -- mutation "context check off by one" ------------------------------------------------------------


def test_prompt_plus_max_tokens_equal_to_the_context_is_served_one_more_refused(tiny_model: Path,
                                                                                 tmp_path: Path) -> None:
    """The Engine API and `python -m engine generate --context-length`: prompt + max_tokens ==
    context runs to max_tokens; one token more is refused before any prefill."""
    eng = make_engine(tiny_model)
    n = len(eng.prompt_ids(SKY))
    room = 5
    limit = n + room
    eng.context_length = limit
    served = eng.generate(request(SKY, max_tokens=room, temperature=0.9, seed=3))
    assert len(served.tokens) == room and served.finish_reason == "length"
    assert served.report.context.limit == limit and served.report.context.prompt_tokens == n
    with pytest.raises(ContextLengthError, match=f"prompt has {n} tokens, max tokens {room + 1}"):
        eng.generate(request(SKY, max_tokens=room + 1))
    eng.close()

    m = write(tmp_path, "sky.json", SKY)
    base = ("generate", "--model", str(tiny_model), "--messages", str(m), "--no-cache", "--json", "--temperature",
            "0.9", "--seed", "3", "--context-length", str(limit))
    ok = run_cli(*base, "--max-tokens", str(room))
    out = json.loads(ok.stdout)
    assert out["tokens"] == served.tokens and out["finish_reason"] == "length"
    refused = run_cli(*base, "--max-tokens", str(room + 1), check=False)
    assert refused.returncode == 2 and refused.stdout == ""
    assert f"prompt has {n} tokens, max tokens {room + 1}, the model's context is {limit}" in refused.stderr


# -- mutation "the sampler reuses one key every step" -------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_tokens_follow_the_documented_key_schedule(tiny_model: Path, temperature: float) -> None:
    """Recompute every sampled token from the reported distribution (top-k = the top logprobs
    reported, so they are all of it) and the seed, with the schedule in engine/generate/sampling.py:
    key_0 = key(seed); key_{i+1}, step_i = split(key_i); token_i = categorical(lp_i / T, step_i)."""
    k, seed, n = 20, 1234, 32
    eng = make_engine(tiny_model)
    req = GenerationRequest(SKY, SamplerSettings(temperature=temperature, top_k=k, seed=seed, max_tokens=n),
                            top_logprobs=k, use_cache=False)
    result = eng.generate(req)
    eng.close()
    assert len(result.tokens) == n and len(result.top_logprobs) == n
    key = mx.random.key(seed)
    recomputed = []
    for top in result.top_logprobs:
        key, step_key = mx.random.split(key)
        ids = mx.array([i for i, _ in top])
        scores = mx.full((1, VOCAB_SIZE), -float("inf"), dtype=mx.float32)
        scores[0, ids] = mx.array([lp for _, lp in top], dtype=mx.float32) / temperature
        recomputed.append(int(mx.random.categorical(scores, axis=-1, key=step_key).item()))
    assert recomputed == result.tokens
    assert len(set(result.tokens)) > 1  # it did sample
