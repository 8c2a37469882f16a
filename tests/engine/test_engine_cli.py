"""`python -m engine generate` as a contract: JSON shape, seeds across processes, bad input."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.cli_helpers import ROOT, run_cli, write
from tests.engine_helpers import make_engine, request



CHAT = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Why is the sky blue?"}]


def test_generate_json_contract_and_repeat(llama, tmp_path):
    m1 = write(tmp_path, "a.json", CHAT)
    m2 = write(tmp_path, "b.json", CHAT + [{"role": "assistant", "content": "Rayleigh."}, {"role": "user", "content": "More?"}])
    proc = run_cli("generate", "--model", str(llama), "--messages", str(m1), "--messages", str(m2),
                   "--repeat", "2", "--max-tokens", "8", "--chunk", "8", "--no-cache", "--json")
    lines = [json.loads(l) for l in proc.stdout.splitlines()]
    assert len(lines) == 4
    for obj in lines:
        assert set(obj) >= {"text", "tokens", "logprobs", "finish_reason", "seed", "cache", "timings"}
        assert len(obj["tokens"]) == len(obj["logprobs"]) <= 8
        assert all(isinstance(x, float) for x in obj["logprobs"])
        assert set(obj["timings"]) == {"ttft_s", "prefill_tps", "decode_tps"}
        for key in ("prompt_tokens", "matched", "restored", "stored", "partial", "source", "layer_offsets",
                    "layers", "declines", "prefill_tokens", "chunks", "mode", "sampler", "seed"):
            assert key in obj["cache"]
        assert obj["cache"]["restored"] == 0 and obj["cache"]["source"] is None  # --no-cache
    assert lines[0]["tokens"] == lines[1]["tokens"] and lines[0]["logprobs"] == lines[1]["logprobs"]


def test_generate_cached_in_process_then_whole_prompt_hit(llama, tmp_path):
    m1 = write(tmp_path, "a.json", CHAT)
    proc = run_cli("generate", "--model", str(llama), "--messages", str(m1), "--repeat", "2", "--max-tokens", "8",
                   "--cache-dir", str(tmp_path / "cache"), "--json")
    first, second = (json.loads(l) for l in proc.stdout.splitlines())
    n = second["cache"]["prompt_tokens"]
    assert second["cache"]["restored"] == n - 1 and second["cache"]["source"] == "memory"
    assert first["tokens"] == second["tokens"] and first["logprobs"] == second["logprobs"]


def test_same_seed_reproduces_across_processes_and_threads(llama, tmp_path):
    m1 = write(tmp_path, "a.json", CHAT)
    args = ("generate", "--model", str(llama), "--messages", str(m1), "--max-tokens", "16", "--temperature", "0.9",
            "--top-p", "0.95", "--top-k", "50", "--no-cache", "--json")
    a = json.loads(run_cli(*args, "--seed", "7").stdout)
    b = json.loads(run_cli(*args, "--seed", "7").stdout)
    c = json.loads(run_cli(*args, "--seed", "8").stdout)
    assert a["tokens"] == b["tokens"] and a["logprobs"] == b["logprobs"]
    assert a["tokens"] != c["tokens"]
    # In-process on a worker thread (where MLX streams are thread-local) too.
    import threading

    out = {}

    def work():
        eng = make_engine(llama, chunk=512)
        out["r"] = eng.generate(request(CHAT, max_tokens=16, temperature=0.9, top_p=0.95, top_k=50, seed=7))

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert out["r"].tokens == a["tokens"] and out["r"].logprobs == a["logprobs"]


@pytest.mark.parametrize(
    "content,expected",
    [
        ('[{"role": "wizard", "content": "x"}]', "unknown role 'wizard'"),
        ("{not json", "is not valid JSON"),
        ("[]", "non-empty list"),
        ('[{"role": "user"}]', "'role' and 'content'"),
    ],
)
def test_bad_messages_one_line_error(llama, tmp_path, content, expected):
    m = write(tmp_path, "bad.json", content)
    proc = run_cli("generate", "--model", str(llama), "--messages", str(m), "--no-cache", check=False)
    assert proc.returncode == 2
    assert expected in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_bad_model_and_missing_file_one_line_error(llama, tmp_path):
    m = write(tmp_path, "a.json", CHAT)
    empty = tmp_path / "empty-model"
    empty.mkdir()
    (empty / "config.json").write_text(json.dumps({"model_type": "llama"}))
    for args in (("--model", str(empty), "--messages", str(m)),
                 ("--model", str(tmp_path / "nope"), "--messages", str(m)),
                 ("--model", str(llama), "--messages", str(tmp_path / "missing.json"))):
        proc = run_cli("generate", *args, "--no-cache", check=False)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr


def test_chat_regenerate_new_debug(llama, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = "Why is the sky blue?\n/regenerate\n/debug\n/new\n/debug\nhello\n/quit\n"
    proc = subprocess.run([sys.executable, "-m", "engine", "chat", "--model", str(llama), "--max-tokens", "6",
                           "--chunk", "8", "--cache-dir", str(tmp_path / "c")], input=script, capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    summaries = [l for l in proc.stderr.splitlines() if l.startswith("[6 tokens")]
    assert len(summaries) == 3
    assert "identical to previous" in summaries[1] and "restored" in summaries[1]
    n = int(summaries[1].split(" of ")[1].split()[0])
    assert f"restored {n - 1} " in summaries[1]  # the regenerate was a whole-prompt hit
    assert "identical to previous: yes" in proc.stderr
    assert "(nothing generated yet)" in proc.stderr  # /debug right after /new


@pytest.mark.parametrize("family", ["llama", "gemma3", "lfm2", "kvquant"])
def test_two_processes_regenerate_from_disk(tmp_path, family):
    """Issue 5's contract through the CLI: a second process regenerates from the disk tier."""
    from tests.tiny_models import build_model

    model = build_model(tmp_path / family, family)
    m = write(tmp_path, "a.json", [{"role": "user", "content": "Explain how a prompt cache works in two sentences. " * 3}])
    args = ("generate", "--model", str(model), "--messages", str(m), "--max-tokens", "12", "--chunk", "8",
            "--cache-dir", str(tmp_path / "cache"), "--json")
    first = json.loads(run_cli(*args).stdout)
    second = json.loads(run_cli(*args).stdout)
    assert first["cache"]["source"] is None
    assert second["cache"]["source"] == "disk"
    assert second["cache"]["restored"] == second["cache"]["prompt_tokens"] - 1
    assert second["tokens"] == first["tokens"] and second["logprobs"] == first["logprobs"]


def test_demo_model_answers_paris(tmp_path):
    """Issue 3's contract: the embedded default model, imported from the wheel's GGUF."""
    from engine.errors import ModelError
    from engine.models.resolve import demo_gguf_path

    try:
        demo_gguf_path()
    except ModelError as e:
        pytest.fail(f"the demo model is part of the set-up (make test installs it): {e}")
    m = write(tmp_path, "capital.json", [{"role": "user", "content": "What is the capital of France?"}])
    proc = run_cli("generate", "--model", "demo", "--messages", str(m), "--max-tokens", "16", "--json",
                   "--cache-dir", str(tmp_path / "cache"))
    obj = json.loads(proc.stdout)
    assert "Paris" in obj["text"] and obj["finish_reason"] == "stop"


def _long_conversation(turns: int, words: int) -> list[dict[str, str]]:
    text = " ".join(["The quick brown fox jumps over the lazy dog."] * words)
    msgs = [{"role": "system", "content": "Answer briefly."}]
    for t in range(turns):
        msgs += [{"role": "user", "content": f"Part {t}: {text}"}, {"role": "assistant", "content": f"Noted {t}."}]
    return msgs + [{"role": "user", "content": "Which animal jumps?"}]


def test_demo_conversation_past_its_context_is_refused_before_any_prefill(tmp_path):
    conv = write(tmp_path, "long.json", _long_conversation(10, 90))  # ~9,500 tokens; the demo has 8,192
    cache = tmp_path / "cache"
    proc = run_cli("generate", "--model", "demo", "--messages", str(conv), "--cache-dir", str(cache), "--json",
                   check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    last = proc.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"error: prompt has (\d+) tokens, max tokens 256, the model's context is 8192", last), last
    assert int(re.search(r"has (\d+)", last).group(1)) > 8192
    assert not list((cache / "snapshots").glob("*.safetensors"))  # nothing was prefilled, nothing stored


def test_truncate_leaves_out_the_oldest_and_regenerates_identically(tmp_path):
    conv = write(tmp_path, "long.json", _long_conversation(6, 12))
    proc = run_cli("generate", "--model", "demo", "--messages", str(conv), "--truncate", "--context-length", "400",
                   "--max-tokens", "8", "--repeat", "2", "--cache-dir", str(tmp_path / "cache"), "--json")
    first, second = [json.loads(line) for line in proc.stdout.splitlines()]
    ctx = first["context"]
    assert ctx["limit"] == 400 and ctx["dropped_messages"] > 0 and ctx["prompt_tokens"] + 8 <= 400
    assert first["cache"]["prompt_tokens"] == ctx["prompt_tokens"] == second["context"]["prompt_tokens"]
    assert second["cache"]["restored"] == second["cache"]["prompt_tokens"] - 1  # in memory, within the run
    assert second["tokens"] == first["tokens"] and second["logprobs"] == first["logprobs"]


def test_conversation_file_with_a_bom_is_read(llama, tmp_path):
    conv = tmp_path / "bom.json"
    conv.write_bytes(b"\xef\xbb\xbf" + json.dumps(CHAT).encode())
    proc = run_cli("generate", "--model", str(llama), "--messages", str(conv), "--max-tokens", "4", "--no-cache",
                   "--json")
    assert len(json.loads(proc.stdout)["tokens"]) <= 4


def test_chat_continue_equals_the_reply_never_cut(llama, tmp_path):
    """/continue after a reply that ended at max tokens: the whole reply is the one asked for
    twice as many tokens from the start (the summary shows the restore and says how)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    common = ["--model", str(llama), "--chunk", "8", "--cache-dir", str(tmp_path / "c"), "--temperature", "0.9",
              "--seed", "5"]

    def chat(script: str, max_tokens: int) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-m", "engine", "chat", *common, "--max-tokens", str(max_tokens)],
                              input=script, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc

    cont = chat("Why is the sky blue?\n/continue\n/quit\n", 6)
    whole = chat("Why is the sky blue?\n/quit\n", 12)
    lines = [l for l in cont.stderr.splitlines() if l.startswith("[6 tokens")]
    assert len(lines) == 2 and "continued from token 6: restored" in lines[1] and "prefilled 1;" in lines[1]
    assert cont.stdout.replace("you> ", "").replace("\n", "") == whole.stdout.replace("you> ", "").replace("\n", "")
