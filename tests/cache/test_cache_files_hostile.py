"""Cache files that cannot hurt (issue 37): a hostile index or a lost pack, through the real
command line (`python -m engine generate` and `python -m engine serve`).

Each case damages a copy of a real cache folder written by a cold run, then asks the same
question: the reply equals the cold run token for token and logprob for logprob, the process
neither crashes nor hangs (subprocess timeouts are only a safety net), and the loss is named in
the report (warnings or declines) and logged once. A damaged index is kept aside, named in the
warning; a second instance sharing the folder keeps serving.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import openai
import pytest

from engine.cache.disk.format import MAX_INDEX_BYTES
from tests.engine_helpers import model_dir

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120  # seconds: a safety net against a hang, never the assertion
CHAT = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Why is the sky blue?"}]
ARGS = ["--max-tokens", "6", "--chunk", "8"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _pack(cache: Path) -> Path:
    packs = sorted((cache / "snapshots").glob("*.safetensors"))
    assert packs, "the cold run wrote no pack"
    return packs[0]


def nested(cache: Path) -> str:
    (cache / "index.json").write_bytes(b"[" * 100_000)
    return "damaged"


def fifo(cache: Path) -> str:
    (cache / "index.json").unlink()
    os.mkfifo(cache / "index.json")
    return "damaged"


def device_link(cache: Path) -> str:
    (cache / "index.json").unlink()
    os.symlink("/dev/zero", cache / "index.json")
    return "damaged"


def index_link(cache: Path) -> str:
    """A symlink to a valid index: read through it, a link could point the cache anywhere."""
    (cache / "index.json").rename(cache / "elsewhere.json")
    os.symlink("elsewhere.json", cache / "index.json")
    return "damaged"


def oversize(cache: Path) -> str:
    with open(cache / "index.json", "r+b") as f:
        f.truncate(MAX_INDEX_BYTES + 1)  # sparse: costs no disk
    return "damaged"


def truncated_pack(cache: Path) -> str:
    p = _pack(cache)
    with open(p, "r+b") as f:
        f.truncate(p.stat().st_size // 2)
    return p.stem


def deleted_pack(cache: Path) -> str:
    p = _pack(cache)
    p.unlink()
    return p.stem


HOSTILE: list[Callable[[Path], str]] = [nested, fifo, device_link, index_link, oversize, truncated_pack, deleted_pack]
INDEX_DAMAGE = {nested, fifo, device_link, index_link, oversize}


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, dict[str, Any]]:
    """(model, messages file, a cache folder written by one cold run, that run's reply)."""
    tmp = tmp_path_factory.mktemp("hostile")
    model = model_dir(tmp, "llama")
    msgs = tmp / "chat.json"
    msgs.write_text(json.dumps(CHAT))
    cache = tmp / "cache"
    proc = subprocess.run([sys.executable, "-m", "engine", "generate", "--model", str(model), "--messages", str(msgs),
                           "--cache-dir", str(cache), "--json", *ARGS], capture_output=True, text=True, env=_env(),
                          cwd=ROOT, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    reply = json.loads(proc.stdout.splitlines()[-1])
    assert reply["cache"]["source"] is None and (cache / "index.json").is_file()
    return model, msgs, cache, reply


def _damaged_copy(src: Path, dst: Path, damage: Callable[[Path], str]) -> str:
    shutil.copytree(src, dst)
    (dst / ".lock").unlink(missing_ok=True)
    return damage(dst)


def _assert_named(losses: list[str], mark: str, damage: Callable[[Path], str], cache: Path) -> None:
    named = [w for w in losses if mark in w]
    assert named, losses
    if damage in INDEX_DAMAGE:
        aside = cache / "index.json.damaged"
        assert os.path.lexists(aside) and "index.json.damaged" in named[0]  # kept aside, and named


@pytest.mark.parametrize("damage", HOSTILE, ids=lambda f: f.__name__)
def test_generate_on_a_hostile_cache_answers_like_a_cold_run_and_names_the_loss(cold, tmp_path: Path,
                                                                                 damage) -> None:
    model, msgs, src, reply = cold
    cache = tmp_path / "cache"
    mark = _damaged_copy(src, cache, damage)
    proc = subprocess.run([sys.executable, "-m", "engine", "generate", "--model", str(model), "--messages", str(msgs),
                           "--cache-dir", str(cache), "--json", *ARGS], capture_output=True, text=True, env=_env(),
                          cwd=ROOT, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["tokens"] == reply["tokens"] and out["logprobs"] == reply["logprobs"]
    assert out["cache"]["source"] is None  # nothing damaged was restored
    losses = out["cache"]["warnings"] + out["cache"]["declines"]
    _assert_named(losses, mark, damage, cache)
    logged = [l for l in proc.stderr.splitlines() if mark in l]
    assert len(logged) == 1, proc.stderr  # logged once
    if damage in INDEX_DAMAGE:  # the folder started afresh: a fresh index, a restore on the next run
        assert (cache / "index.json").is_file() and not (cache / "index.json").is_symlink()
        again = subprocess.run([sys.executable, "-m", "engine", "generate", "--model", str(model), "--messages",
                                str(msgs), "--cache-dir", str(cache), "--json", *ARGS], capture_output=True,
                               text=True, env=_env(), cwd=ROOT, timeout=TIMEOUT)
        assert again.returncode == 0, again.stderr
        warm = json.loads(again.stdout.splitlines()[-1])
        assert warm["cache"]["source"] == "disk" and warm["cache"]["warnings"] == []
        assert warm["tokens"] == reply["tokens"] and warm["logprobs"] == reply["logprobs"]


def _spawn(model: Path, cache: Path) -> tuple[subprocess.Popen, str, list[str]]:
    p = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--model", str(model), "--port", "0",
                          "--cache-dir", str(cache), "--chunk", "8"], stderr=subprocess.PIPE, text=True, env=_env(),
                         cwd=ROOT)
    assert p.stderr is not None
    seen: list[str] = []
    for line in p.stderr:  # ends at EOF if the server dies
        seen.append(line)
        if line.startswith("Verbatim server:") and " at http" in line:
            return p, line.split(" at ", 1)[1].split()[0], seen
    p.wait(TIMEOUT)
    pytest.fail(f"server did not start (rc {p.returncode}): {''.join(seen)}")


def _stop(p: subprocess.Popen, seen: list[str]) -> str:
    p.send_signal(signal.SIGINT)
    assert p.stderr is not None
    rest = "".join(seen) + p.stderr.read()
    assert p.wait(TIMEOUT) == 0, rest
    return rest


def _ask(url: str, model: Path) -> Any:
    cl = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=TIMEOUT)
    return cl.chat.completions.create(model=model.name, messages=CHAT, max_tokens=6, temperature=0, seed=0,
                                      logprobs=True)


def _lps(resp: Any) -> list[float]:
    return [t.logprob for t in resp.choices[0].logprobs.content]


@pytest.mark.parametrize("damage", HOSTILE, ids=lambda f: f.__name__)
def test_serve_on_a_hostile_cache_starts_answers_like_a_cold_run_and_names_the_loss(cold, tmp_path: Path,
                                                                                    damage) -> None:
    model, _, src, _ = cold
    reference = tmp_path / "reference"
    p, url, seen = _spawn(model, reference)  # the cold reply as the server gives it
    try:
        ref = _ask(url, model)
    finally:
        _stop(p, seen)
    cache = tmp_path / "cache"
    mark = _damaged_copy(src, cache, damage)
    p, url, seen = _spawn(model, cache)
    try:
        resp = _ask(url, model)
    finally:
        log = _stop(p, seen)
    assert resp.verbatim["token_ids"] == ref.verbatim["token_ids"] and _lps(resp) == _lps(ref)
    assert resp.verbatim["source"] is None
    mark = mark if damage not in INDEX_DAMAGE else "damaged"
    assert [w for w in resp.verbatim["warnings"] + resp.verbatim["declines"] if mark in w], resp.verbatim
    assert len([l for l in log.splitlines() if mark in l]) == 1, log
    if damage in INDEX_DAMAGE:
        assert os.path.lexists(cache / "index.json.damaged")


def _wait_for_index(cache: Path, n: int) -> None:
    """Until the writer's index on disk holds `n` snapshots (polled: the event is in another process)."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        try:
            if len(json.loads((cache / "index.json").read_bytes())["entries"]) >= n:
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    pytest.fail("the writer never wrote its index")


def test_a_second_server_sharing_a_damaged_folder_keeps_serving(cold, tmp_path: Path) -> None:
    """The writer runs; the index is replaced by a nested one; a second server on the same folder
    (a reader) starts, answers like a cold run and names the damage; the writer keeps answering."""
    model, _, _, _ = cold
    cache = tmp_path / "cache"
    a, url_a, seen_a = _spawn(model, cache)
    try:
        first = _ask(url_a, model)
        assert first.verbatim["source"] is None
        _wait_for_index(cache, len(first.verbatim["snapshots_stored"]))  # the writer is done with it
        (cache / "index.json").write_bytes(b"{" * 100_000)
        b, url_b, seen_b = _spawn(model, cache)
        try:
            second = _ask(url_b, model)
        finally:
            _stop(b, seen_b)
        again = _ask(url_a, model)
    finally:
        _stop(a, seen_a)
    assert second.verbatim["token_ids"] == first.verbatim["token_ids"] and _lps(second) == _lps(first)
    assert any("damaged" in w for w in second.verbatim["warnings"]), second.verbatim
    assert again.verbatim["token_ids"] == first.verbatim["token_ids"] and _lps(again) == _lps(first)
    assert again.verbatim["source"] == "memory"
