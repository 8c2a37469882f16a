"""Receipts (engine/receipts.py) and `python -m engine verify`: round trips on every cache family,
tampered receipts caught at the right token, a missing or other model refused with exit 2, and an
exact-mode receipt made with a warm cache replayed cold (G3 end to end)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine import receipts
from engine.cli.main import main as cli
from engine.receipts import ReceiptError, ReceiptModel
from engine.types import CancelToken, Comparison, TokenEvent
from tests.engine_helpers import (
    ALL_FAMILIES,
    make_engine,
    request,
    require_openblas,
)

ROOT = Path(__file__).resolve().parents[2]
CHAT = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Why is the sky blue?"},
    {"role": "assistant", "content": "Because of Rayleigh scattering of sunlight."},
    {"role": "user", "content": "Explain how a prompt cache works in two sentences."},
]
SAMPLED = dict(temperature=0.9, top_p=0.95, seed=7)


def make_receipt(eng, folder, req, result):
    info = eng.info
    return receipts.build(req, result, ReceiptModel(str(folder), info.key, info.name, info.dequantized), eng.chunk)


def warm_exact_receipt(folder, tmp_path, max_tokens=24):
    """An exact-mode reply generated on a warm cache (the first turn cached, then the follow-up),
    as a receipt file: what a cold replay must reproduce bit for bit."""
    eng = make_engine(folder, chunk=8, use_disk=True, cache_dir=tmp_path / "cache")
    try:
        eng.generate(request(CHAT[:2], max_tokens=8, **SAMPLED))
        req = request(CHAT, max_tokens=max_tokens, **SAMPLED)
        result = eng.generate(req)
        assert result.report.restored > 0  # the prompt came (partly) from the cache
        receipt = make_receipt(eng, folder, req, result)
    finally:
        eng.close()
    path = tmp_path / "reply.receipt.json"
    receipts.write(receipt, path)
    return path, receipt


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_round_trip_replays_bit_identical_cold_and_cached(models, family, tmp_path):
    require_openblas()
    path, receipt = warm_exact_receipt(models[family], tmp_path)
    again = receipts.read(path)
    assert again == receipt and again.logprobs_sha256 == receipts.logprobs_sha256(receipt.logprobs)
    bom = tmp_path / "bom.receipt.json"  # saved by an editor that writes a UTF-8 BOM
    bom.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert receipts.read(bom) == receipt
    assert json.loads(path.read_text())["format"] == "verbatim.receipt"
    for use_cache in (False, True):
        eng = receipts.open_engine(again, use_disk=use_cache, cache_dir=tmp_path / "cache")
        try:
            verdict = receipts.replay(again, eng, use_cache=use_cache)
        finally:
            eng.close()
        assert verdict.ok, verdict.line()
        assert verdict.tokens == receipt.tokens and verdict.comparison.identical
        assert verdict.line().startswith("OK")


def test_cli_generate_receipt_then_verify_no_cache_is_zero(models, tmp_path):
    """G3 end to end through the CLI, in fresh processes: the second generation restores its prompt
    from the cache; its exact-mode receipt replayed with --no-cache matches bit for bit."""
    require_openblas()
    msgs = tmp_path / "chat.json"
    msgs.write_text(json.dumps(CHAT))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def run(*args):
        return subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True, env=env, cwd=ROOT)

    gen = run("generate", "--model", str(models["llama"]), "--messages", str(msgs), "--repeat", "2", "--max-tokens", "16",
              "--temperature", "0.9", "--seed", "3", "--chunk", "8", "--cache-dir", str(tmp_path / "cache"), "--json",
              "--receipt", str(tmp_path / "r.json"))
    assert gen.returncode == 0, gen.stderr
    second = json.loads(gen.stdout.splitlines()[1])
    assert second["cache"]["restored"] == second["cache"]["prompt_tokens"] - 1
    doc = json.loads((tmp_path / "r-2.json").read_text())
    assert doc["tokens"] == second["tokens"] and doc["model"]["key"] == second["cache"]["model_key"]
    assert set(doc["environment"]) >= {"engine", "mlx", "mlx_lm", "blas"}
    assert doc["sampler"]["seed"] == 3 and doc["mode"] == "exact" and doc["chunk"] == 8
    proc = run("verify", str(tmp_path / "r-2.json"), "--no-cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("OK")


def test_tampered_token_seed_and_settings_exit_one_at_the_right_index(models, tmp_path, capsys):
    folder = models["llama"]
    eng = make_engine(folder)
    req = request(CHAT, max_tokens=24, **SAMPLED)
    result = eng.generate(req)
    receipt = make_receipt(eng, folder, req, result)

    def verify(r, name):
        path = tmp_path / name
        receipts.write(r, path)
        capsys.readouterr()
        code = cli(["verify", str(path), "--no-cache"])
        return code, capsys.readouterr().out

    code, out = verify(receipt, "good.json")
    assert code == 0, out

    # A token edited: the replay gives the original, so they part exactly there.
    k = 5
    tokens = list(receipt.tokens)
    tokens[k] = (tokens[k] + 1) % 512
    code, out = verify(dataclasses.replace(receipt, tokens=tokens), "token.json")
    assert code == 1 and f"first divergent token at index {k} " in out and f"shared prefix {k} tokens" in out

    # Another seed / temperature: the replay follows the receipt's (edited) request; they part where
    # a generation with that request parts from the receipt's tokens.
    for name, sampler in (("seed", dataclasses.replace(receipt.sampler, seed=8)),
                          ("settings", dataclasses.replace(receipt.sampler, temperature=0.5))):
        other = eng.generate(dataclasses.replace(req, sampler=sampler))
        expected = Comparison.of(receipt.tokens, receipt.logprobs, other.tokens, other.logprobs)
        first = next(i for i, (a, b) in enumerate(zip(receipt.tokens, other.tokens)) if a != b)
        assert expected.first_diff == first
        code, out = verify(dataclasses.replace(receipt, sampler=sampler), f"{name}.json")
        assert code == 1 and f"first divergent token at index {first} " in out, out
        delta = f"{expected.max_logprob_diff:.3g}"
        assert f"max |delta logprob| over the shared prefix {delta}" in out
    eng.close()


def test_missing_or_other_model_and_bad_files_exit_two(models, tmp_path, capsys):
    folder = models["llama"]
    eng = make_engine(folder)
    req = request(CHAT[:2], max_tokens=6)
    receipt = make_receipt(eng, folder, req, eng.generate(req))
    eng.close()
    gone = dataclasses.replace(receipt, model=dataclasses.replace(receipt.model, spec=str(tmp_path / "nowhere")))
    receipts.write(gone, tmp_path / "gone.json")
    assert cli(["verify", str(tmp_path / "gone.json")]) == 2
    err = capsys.readouterr().err
    assert receipt.model.key in err and "nowhere" in err
    # The spec loads a model with another key (other weights): refused, both keys named.
    receipts.write(receipt, tmp_path / "ok.json")
    assert cli(["verify", str(tmp_path / "ok.json"), "--model", str(models["gemma3"]), "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert "another model" in err and receipt.model.key in err
    # Not a receipt; logprobs that no longer match their hash.
    (tmp_path / "junk.json").write_text("[1, 2]")
    assert cli(["verify", str(tmp_path / "junk.json")]) == 2
    assert "not a Verbatim receipt" in capsys.readouterr().err
    doc = json.loads((tmp_path / "ok.json").read_text())
    doc["logprobs"][0] += 1.0
    (tmp_path / "edited.json").write_text(json.dumps(doc))
    assert cli(["verify", str(tmp_path / "edited.json")]) == 2
    assert "do not match its logprobs_sha256" in capsys.readouterr().err
    assert cli(["verify", str(tmp_path / "absent.json")]) == 2


def test_other_environment_is_replayed_and_named(models, tmp_path, capsys):
    folder = models["llama"]
    eng = make_engine(folder)
    req = request(CHAT[:2], max_tokens=6)
    receipt = make_receipt(eng, folder, req, eng.generate(req))
    eng.close()
    env = {**receipt.environment, "mlx": "0.0.1", "blas": "elsewhere/libblas.so"}
    receipts.write(dataclasses.replace(receipt, environment=env), tmp_path / "other-env.json")
    assert cli(["verify", str(tmp_path / "other-env.json"), "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK") and "environment differs" in out and "0.0.1 in the receipt" in out


def test_stopped_reply_is_replayed_up_to_where_it_stopped(models, tmp_path):
    folder = models["llama"]
    eng = make_engine(folder)
    req = request(CHAT, max_tokens=40, temperature=0.0)
    cancel = CancelToken()
    stopped = eng.generate(req, lambda e: isinstance(e, TokenEvent) and e.index == 9 and cancel.cancel(), cancel)
    assert stopped.finish_reason == "cancelled" and len(stopped.tokens) == 10
    receipt = make_receipt(eng, folder, req, stopped)
    assert receipt.sampler.max_tokens == 40  # the request as it was
    verdict = receipts.replay(receipt, eng, use_cache=False)
    assert verdict.ok and verdict.tokens == stopped.tokens
    with pytest.raises(ReceiptError):
        receipts.build(req, dataclasses.replace(stopped, tokens=[], logprobs=[]), receipt.model, eng.chunk)
    eng.close()


def test_comparison_prefixes_and_shared_length():
    a, b = [1, 2, 3, 4], [1, 2, 9, 4, 5]
    c = Comparison.of(a, [0.0, -1.0, -2.0, -3.0], b, [0.0, -1.5, -2.0, -3.0, -4.0], "ab c", "ab x")
    assert (c.identical, c.first_diff, c.shared_tokens, c.shared_chars, c.lengths) == (False, 2, 2, 3, (4, 5))
    assert c.max_logprob_diff == 0.5
    same = Comparison.of(a, [0.0] * 4, a + [7], [0.0] * 5)
    assert same.first_diff == 4 and same.shared_tokens == 4 and not same.identical
    upto = Comparison.of(a, [0.0] * 4, a + [7], [0.0] * 5, shared_length=True)
    assert upto.identical and upto.upto == 4 and "up to where the first one stopped" in upto.detail
