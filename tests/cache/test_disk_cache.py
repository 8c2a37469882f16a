"""The disk tier of the prompt cache: restarts (G2), crashes, corruption, full/read-only disks,
changed models, hostile index files, the budget, and that writing never delays a reply.

Real MLX, real files and real child processes (SIGKILL); faults are injected only at the file
write level (or with a real tmpfs when the test may mount one).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from engine.blas import blas_library
from engine.cache import env as cache_env
from engine.cache.disk import files as disk_files
from engine.cache.disk import format as disk_format
from engine.cache.disk import store as disk_store
from engine.cache.disk import writer as dw
from engine.cache.disk.hooks import WriterHooks
from engine.cache.disk.packfiles import TMP_PREFIX
from engine.cache.disk.tier import DiskCache
from engine.cache.prompt_cache import PromptCache
from engine.engine import Engine
from engine.errors import SnapshotError
from engine.types import GenerationRequest, SamplerSettings
from tests.disk_helpers import KEY, assert_consistent, index_rows, packs_used, snapshot_files
from tests.engine_helpers import forwards, kv_snapshot, require_openblas
from tests.tiny_models import FAMILIES, build_model

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).parents[1] / "disk_fault_child.py"
# Long enough that gemma3's 24-token window wraps and every family stores boundary checkpoints.
MESSAGES = [{"role": "user", "content": "Explain how a prompt cache works in two sentences. " * 3}]
OTHER = [{"role": "user", "content": "Why is the sky blue? Because of Rayleigh scattering."}]
MAX_TOKENS = 16


pytestmark = pytest.mark.usefixtures("hash_memo_in_basetemp")


def req(messages=MESSAGES, max_tokens: int = MAX_TOKENS) -> GenerationRequest:
    return GenerationRequest(messages, SamplerSettings(max_tokens=max_tokens))


def engine(model: Path, cache_dir: Path, **kw: Any) -> Engine:
    e = Engine(cache_dir=cache_dir, chunk=8, **kw)
    e.load(str(model))
    return e


def cold(model: Path, messages=MESSAGES) -> tuple[list[int], list[float]]:
    e = Engine(use_disk=False, chunk=8)
    e.load(str(model))
    r = e.generate(GenerationRequest(messages, SamplerSettings(max_tokens=MAX_TOKENS), use_cache=False))
    return r.tokens, r.logprobs


def child_env(reference_blas: bool = False, **extra: str) -> dict[str, str]:
    """Env for a child process. By default it inherits this process's BLAS choice (the
    LD_PRELOAD that `make test` sets, from VERBATIM_OPENBLAS or the usual paths): the disk tier
    never restores a state computed with another BLAS, and tests restore a child's snapshots here.

    reference_blas=True: every preloaded BLAS removed, so MLX uses its own reference BLAS."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **extra}
    if reference_blas:
        kept = [p for p in env.get("LD_PRELOAD", "").split(":") if p and "blas" not in Path(p).name.lower()]
        env["LD_PRELOAD"] = ":".join(kept)
        env["VERBATIM_NO_OPENBLAS"] = "1"
    return env


def run_child(tmp: Path, name: str, cache_dir: Path, runs: list[dict], env: dict[str, str],
              hook: dict | None = None) -> subprocess.Popen:
    out = tmp / f"{name}.out.json"
    spec = tmp / f"{name}.spec.json"
    spec.write_text(json.dumps({"cache_dir": str(cache_dir), "chunk": 8, "out": str(out), "runs": runs, "hook": hook}))
    return subprocess.Popen([sys.executable, str(CHILD), str(spec)], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def child_results(tmp: Path, name: str, proc: subprocess.Popen, timeout: float = 120) -> list[dict]:
    _, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return json.loads((tmp / f"{name}.out.json").read_text())


# ---------------------------------------------------------------------------------------------
# G2: a restart regenerates from disk, bit for bit


def test_restart_restores_from_disk_bit_identical_on_every_family(models, tmp_path):
    cache_dir = tmp_path / "cache"
    runs = [{"model": str(models[f]), "messages": MESSAGES, "max_tokens": MAX_TOKENS} for f in FAMILIES]
    first = child_results(tmp_path, "first", run_child(tmp_path, "first", cache_dir, runs, child_env()))
    second = child_results(tmp_path, "second", run_child(tmp_path, "second", cache_dir, runs, child_env()))
    assert_consistent(cache_dir)
    for fam, a, b in zip(FAMILIES, first, second):
        assert a["report"]["source"] is None, fam
        assert a["disk"]["writes"] >= 1 and a["disk"]["write_errors"] == 0, (fam, a["disk"])
        rep = b["report"]
        assert rep["source"] == "disk", (fam, rep["declines"])
        assert rep["restored"] == rep["prompt_tokens"] - 1, fam
        # `a` is a cold run (a fresh process, an empty cache); `b` restored from disk.
        assert b["tokens"] == a["tokens"], fam
        assert b["logprobs"] == a["logprobs"], fam  # bit-equal (JSON floats round-trip exactly)
        assert a["blas"] == b["blas"] == blas_library()  # the children used this process's BLAS


@pytest.mark.linux_only  # LD_PRELOAD of OpenBLAS: macOS has Accelerate (and Metal), nothing to remove
def test_restart_under_the_reference_blas_never_restores(models, tmp_path):
    """The same cache read by a process on MLX's reference BLAS: those states are not its bits
    (G3), so they are never restored there."""
    require_openblas()  # needs an optimized BLAS to differ from: fails in CI, skips locally
    cache_dir = tmp_path / "cache"
    runs = [{"model": str(models[f]), "messages": MESSAGES, "max_tokens": MAX_TOKENS} for f in FAMILIES]
    first = child_results(tmp_path, "first", run_child(tmp_path, "first", cache_dir, runs, child_env()))
    assert all(a["blas"] == blas_library() and a["disk"]["writes"] >= 1 for a in first)
    third = child_results(tmp_path, "third", run_child(tmp_path, "third", cache_dir, runs,
                                                       child_env(reference_blas=True)))
    if any(c["blas"] == blas_library() for c in third):
        pytest.skip(f"this process's BLAS ({blas_library()}) is not preloaded through LD_PRELOAD: "
                    "a child cannot be started without it")
    for fam, c in zip(FAMILIES, third):
        assert c["report"]["source"] is None and c["report"]["declines"] == [], fam
        assert c["disk"]["entries_other_env"] >= 1, fam


def write_one_entry(root: Path) -> dict:
    """A cache folder holding one small snapshot; returns its index row."""
    d = DiskCache(root, budget_bytes=1 << 30)
    d.save_async(kv_snapshot(list(range(20))))
    assert d.flush(10)
    d.close()
    return index_rows(root)[0]


def test_entries_from_another_compute_environment_are_kept_but_never_returned(tmp_path, monkeypatch):
    write_one_entry(tmp_path / "c")
    monkeypatch.setattr(cache_env, "_ENV", "mlx 9.9; other kernels")
    d = DiskCache(tmp_path / "c", budget_bytes=1 << 30)
    assert d.entries(KEY) == []
    assert d.stats()["entries"] == d.stats()["entries_other_env"] == 1  # still counts toward the budget
    d.close()
    assert_consistent(tmp_path / "c")


# ---------------------------------------------------------------------------------------------
# SIGKILL while a snapshot is being written

# Writer points (engine/cache/disk/), in order: the pack (its blocks), then the manifest commit
# (the index); the index lists the snapshot from index_written on.
KILL_POINTS = ["begin", "temp_partial", "temp_synced", "renamed", "index_tmp", "index_written"]
TURN2 = MESSAGES + [{"role": "assistant", "content": "A prompt cache keeps model state."},
                    {"role": "user", "content": "And then?"}]


@pytest.mark.parametrize("point", KILL_POINTS)
def test_sigkill_while_writing_leaves_consistent_cache(models, tmp_path, point):
    cache_dir = tmp_path / "cache"
    trace = tmp_path / "trace"
    hook = {"trace": str(trace), "sleep": {point: 120}}
    run = [{"model": str(models["llama"]), "messages": MESSAGES, "max_tokens": MAX_TOKENS}]
    proc = run_child(tmp_path, "victim", cache_dir, run, child_env(), hook)  # restored here below
    _kill_at(proc, trace, point)
    left = [p.name for p in cache_dir.rglob("*")]
    if point in ("temp_partial", "temp_synced", "index_tmp"):
        assert any(n.startswith(".tmp-") for n in left), left  # the kill really hit mid-write

    disk = DiskCache(cache_dir, budget_bytes=1 << 30)
    stats = disk.stats()
    disk.close()
    assert not [p for p in cache_dir.rglob(".tmp-*")], "temp files survive an open"
    if (cache_dir / "index.json").exists():
        assert_consistent(cache_dir)
    else:
        assert not snapshot_files(cache_dir)
    # Only a write whose manifest was committed may be restored; anything earlier leaves nothing.
    assert stats["entries"] == (1 if point == "index_written" else 0), stats
    # Packs renamed but never named by a committed index are garbage; a committed index names
    # only packs that are there (none rejected on open).
    assert (stats["orphans_removed_on_open"] >= 1) == (point in ("renamed", "index_tmp")), stats
    assert stats["rejected_on_open"] == 0, stats

    eng = engine(models["llama"], cache_dir)
    r = eng.generate(req())
    eng.close()
    assert r.report.source == ("disk" if point == "index_written" else None)
    assert r.report.declines == []
    assert (r.tokens, r.logprobs) == cold(models["llama"])
    assert_consistent(cache_dir)


def _kill_at(proc: subprocess.Popen, trace: Path, point: str, after_done: int = 0) -> None:
    """SIGKILL the child once its writer reached `point` (after `after_done` finished saves)."""
    deadline = time.monotonic() + 60
    while True:
        seen = trace.read_text().split() if trace.exists() else []
        done_at = [i for i, p in enumerate(seen) if p == "done"]
        tail = seen[done_at[after_done - 1] + 1:] if after_done and len(done_at) >= after_done else (
            seen if not after_done else [])
        if point in tail:
            break
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the writer never reached " + point
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)


@pytest.mark.parametrize("point", KILL_POINTS)
def test_sigkill_while_a_second_turn_shares_blocks_loses_nothing_referenced(models, tmp_path, point):
    """Turn 1 is on disk; turn 2 (which shares turn 1's blocks up to turn 1's reply) is killed at
    each step of its pack write and its manifest commit: turn 1 still restores exactly, turn 2
    exists only if its manifest was committed, and nothing on disk is left unaccounted for."""
    cache_dir = tmp_path / "cache"
    trace = tmp_path / "trace"
    hook = {"trace": str(trace), "sleep": {point: 120}, "after_done": 1}
    runs = [{"model": str(models["llama"]), "messages": m, "max_tokens": MAX_TOKENS} for m in (MESSAGES, TURN2)]
    proc = run_child(tmp_path, "victim", cache_dir, runs, child_env(), hook)
    _kill_at(proc, trace, point, after_done=1)
    disk = DiskCache(cache_dir, budget_bytes=1 << 30)
    stats = disk.stats()
    disk.close()
    assert not [p for p in cache_dir.rglob(".tmp-*")]
    assert_consistent(cache_dir)
    assert stats["entries"] == (2 if point == "index_written" else 1), stats
    assert stats["rejected_on_open"] == 0, stats
    if point == "index_written":
        first, second = sorted(index_rows(cache_dir), key=lambda r: len(r["tokens"]))
        assert second["blocks"][:3] == first["blocks"][:3]  # shared, stored once
    for messages in (MESSAGES, TURN2):
        eng = engine(models["llama"], cache_dir)
        r = eng.generate(req(messages))
        eng.close()
        assert r.report.declines == []
        assert (r.tokens, r.logprobs) == cold(models["llama"], messages)
        if messages is MESSAGES:
            assert r.report.source == "disk" and r.report.restored == r.report.prompt_tokens - 1
    assert_consistent(cache_dir)


# ---------------------------------------------------------------------------------------------
# Corruption behind the index's back


def _corrupt(path: Path, how: str) -> None:
    if how == "flip":
        data = bytearray(path.read_bytes())
        data[len(data) * 2 // 3] ^= 0x01
        path.write_bytes(bytes(data))
    elif how == "truncate":
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size // 2)
    elif how == "delete":
        path.unlink()


@pytest.mark.parametrize("how", ["flip", "truncate", "delete"])
def test_corrupt_snapshot_is_declined_removed_and_reply_equals_cold(models, tmp_path, how):
    cache_dir = tmp_path / "cache"
    eng = engine(models["llama"], cache_dir)
    first = eng.generate(req())
    eng.close()
    [row] = index_rows(cache_dir)  # "end" (it serves every restore "pre-last" could, so that one went)
    files = packs_used(cache_dir, row)
    assert files == snapshot_files(cache_dir) and len(files) == 2  # its prefill's blocks, its decoded tail

    eng = engine(models["llama"], cache_dir)  # the index is loaded; now the file goes bad
    for f in files:
        _corrupt(f, how)
    r = eng.generate(req())
    disk = eng.cache.disk
    assert r.report.source is None
    assert r.report.restored == 0
    unusable = [d for d in r.report.declines if "unusable" in d]
    assert unusable, r.report.declines
    assert row["id"] not in {m.id for m in disk.entries(eng.lm.key)}  # dropped at once
    eng.close()
    for d in unusable:
        sid = d.split("snapshot ")[1].split(" unusable")[0]
        assert sid not in {row["id"] for row in index_rows(cache_dir)}  # entry removed
    assert (r.tokens, r.logprobs) == (first.tokens, first.logprobs) == cold(models["llama"])
    assert_consistent(cache_dir)  # the new generation's snapshot, and nothing broken


def test_one_bad_snapshot_falls_back_to_another(models, tmp_path):
    cache_dir = tmp_path / "cache"
    eng = engine(models["gemma3"], cache_dir)
    eng.generate(req())
    eng.close()
    eng = engine(models["gemma3"], cache_dir)
    pre_last = next(r for r in index_rows(cache_dir) if r["kind"] == "pre-last")
    _corrupt(cache_dir / "snapshots" / f"{pre_last['whole']}.safetensors", "flip")  # its own pack
    r = eng.generate(req())
    eng.close()
    assert any(pre_last["id"] in d and "checksum" in d for d in r.report.declines), r.report.declines
    assert r.report.source == "disk"  # the boundary checkpoint, then an aligned prefill
    assert 0 < r.report.restored < r.report.prompt_tokens - 1
    assert (r.tokens, r.logprobs) == cold(models["gemma3"])


def test_damage_found_on_open_and_tampered_entries(models, tmp_path):
    """A pack truncated before open makes exactly the snapshots using it unusable (rejected on
    open); a manifest whose history was edited no longer matches its blocks' names (declined)."""
    cache_dir = tmp_path / "cache"
    eng = engine(models["lfm2"], cache_dir)
    eng.generate(req())
    eng.generate(req(OTHER))
    eng.close()
    rows = index_rows(cache_dir)
    assert len(rows) == 6  # boundary, pre-last and end of each prompt
    # The first prompt's boundary pack holds blocks its pre-last and end use too.
    boundary = next(r for r in rows if r["kind"] == "boundary" and r["tokens"] == rows[0]["tokens"][: len(r["tokens"])])
    bad = packs_used(cache_dir, boundary)[-1]
    users = [r["id"] for r in rows if bad in packs_used(cache_dir, r)]
    assert len(users) >= 3
    rest = [r for r in rows if r["id"] not in users]
    _corrupt(bad, "truncate")
    doc = json.loads((cache_dir / "index.json").read_text())
    victim = next(r for r in doc["entries"] if r["kind"] == "pre-last" and r["id"] not in users)
    n = len(victim["tokens"])
    victim["forwards"] = [[0, n, n]]  # a history it did not have: its blocks' names disagree
    (cache_dir / "index.json").write_text(json.dumps(doc))
    eng = engine(models["lfm2"], cache_dir)
    stats = eng.cache.disk.stats()
    assert stats["rejected_on_open"] == 1 + len(users), stats  # the pack and exactly its users
    assert {m.id for m in eng.cache.disk.entries(eng.lm.key)} == {r["id"] for r in rest}
    r = eng.generate(req())
    assert r.report.source is None
    assert (r.tokens, r.logprobs) == cold(models["lfm2"])
    r2 = eng.generate(req(OTHER))
    eng.close()
    assert any(victim["id"] in d and "do not match" in d for d in r2.report.declines), r2.report.declines
    assert (r2.tokens, r2.logprobs) == cold(models["lfm2"], OTHER)
    assert_consistent(cache_dir)


def _forge_meta(cache_dir: Path, sid: str, **changes: Any) -> None:
    """Change one snapshot's manifest in the index (a snapshot's meta is nowhere else): what a
    writer bug or a crafted cache folder would leave."""
    doc = json.loads((cache_dir / "index.json").read_text())
    for r in doc["entries"]:
        if r["id"] == sid:
            r.update(changes)
    (cache_dir / "index.json").write_text(json.dumps(doc))


def test_forged_trimmable_flag_never_allows_a_partial_restore(models, tmp_path):
    """G5 against the index: a wrapped sliding-window snapshot whose index entry (and header)
    claim it can be cut back is refused when loaded, never restored partially; the reply is the
    one an honest copy of the cache gives."""
    cache_dir = tmp_path / "cache"
    eng = engine(models["gemma3"], cache_dir)
    first = eng.generate(req())
    eng.close()
    turn2 = GenerationRequest(MESSAGES + [{"role": "assistant", "content": first.text},
                                          {"role": "user", "content": "And then?"}],
                              SamplerSettings(max_tokens=MAX_TOKENS), mode="fast")
    honest_dir = tmp_path / "honest"
    shutil.copytree(cache_dir, honest_dir)
    end = next(r for r in index_rows(cache_dir) if r["kind"] == "end")
    assert end["trimmable"] is False  # the ring wrapped
    _forge_meta(cache_dir, end["id"], trimmable=True)

    honest = engine(models["gemma3"], honest_dir)
    h = honest.generate(turn2)
    honest.close()
    # Honestly flagged, the end snapshot (the longest match) is declined for what it is.
    assert any("sliding window wrapped" in d for d in h.report.declines), h.report.declines
    assert h.report.source == "disk" and h.report.restored > 0

    eng = engine(models["gemma3"], cache_dir)
    with forwards(eng) as log:
        r = eng.generate(turn2)
    eng.close()
    assert any(end["id"] in d and "cannot" in d for d in r.report.declines), r.report.declines
    assert log.spans[0][0] == r.report.restored == h.report.restored  # the state the model found
    assert (r.tokens, r.logprobs) == (h.tokens, h.logprobs)
    assert end["id"] not in {row["id"] for row in index_rows(cache_dir)}  # and the entry is gone


def test_one_cache_dir_two_chunk_sizes_never_share_snapshots(models, tmp_path):
    """The chunk size decides which widths a prefill forwards, hence the cached bits: an engine
    with another chunk size must not restore these snapshots, and equals its own cold run."""
    cache_dir = tmp_path / "cache"
    a = engine(models["llama"], cache_dir)  # chunk 8
    a.generate(req())
    a.close()
    b = Engine(cache_dir=cache_dir, chunk=16)
    b.load(str(models["llama"]))
    r = b.generate(req())
    b.close()
    assert r.report.source is None and r.report.restored == 0 and r.report.matched == 0
    c = Engine(use_disk=False, chunk=16)
    c.load(str(models["llama"]))
    cold16 = c.generate(GenerationRequest(MESSAGES, SamplerSettings(max_tokens=MAX_TOKENS), use_cache=False))
    assert (r.tokens, r.logprobs) == (cold16.tokens, cold16.logprobs)


# ---------------------------------------------------------------------------------------------
# Disk full, read-only folder


def _raise_on_write(code: int):
    def write(self, b):
        self.error = OSError(code, os.strerror(code))
        raise self.error

    return write


def test_disk_full_generation_completes_user_told_once(models, tmp_path, monkeypatch):
    cache_dir = tmp_path / "cache"
    warnings: list[str] = []
    monkeypatch.setattr(disk_files.HashingWriter, "write", _raise_on_write(errno.ENOSPC))
    eng = engine(models["llama"], cache_dir)
    eng.cache.disk.on_warning = warnings.append
    a = eng.generate(req())
    b = eng.generate(req(OTHER))
    again = eng.generate(req())
    assert eng.cache.disk.flush(10)
    stats = eng.cache.disk.stats()
    assert stats["write_errors"] >= 2 and "No space left" in stats["last_error"]
    assert len(warnings) == 1 and "disk is full" in warnings[0]
    # Each warning reaches the user once: in a later report (writes are in the background) or
    # still pending for the next one.
    told = a.report.warnings + b.report.warnings + again.report.warnings + eng.cache.disk.pop_warnings()
    assert told == warnings and eng.cache.disk.pop_warnings() == []
    assert again.report.source == "memory" and (again.tokens, again.logprobs) == (a.tokens, a.logprobs)
    assert b.tokens and stats["entries"] == 0
    assert not list((cache_dir / "snapshots").iterdir())  # no temp file (nor pack) left behind
    # Space comes back: writing resumes without a restart.
    monkeypatch.undo()
    monkeypatch.setenv("VERBATIM_CACHE_DIR", str(tmp_path / "memo"))
    eng.generate(req([{"role": "user", "content": "The quick brown fox"}]))
    eng.close()
    assert eng.cache.disk.stats()["entries"] >= 1 and len(warnings) == 1
    assert_consistent(cache_dir)


def test_read_only_error_stops_writes_and_warns_once(models, tmp_path, monkeypatch):
    cache_dir = tmp_path / "cache"
    eng = engine(models["llama"], cache_dir)
    eng.generate(req(OTHER))
    assert eng.cache.disk.flush(10)
    before = index_rows(cache_dir)
    monkeypatch.setattr(disk_files.HashingWriter, "write", _raise_on_write(errno.EROFS))
    r1 = eng.generate(req())
    r2 = eng.generate(req())
    eng.close()
    stats = eng.cache.disk.stats()
    assert stats["writable"] is False and stats["write_errors"] == 1
    assert len(stats["warnings"]) == 1 and "not writable" in stats["warnings"][0]
    assert r2.report.source == "memory" and (r1.tokens, r1.logprobs) == (r2.tokens, r2.logprobs)
    assert index_rows(cache_dir) == before  # what was there is intact
    assert_consistent(cache_dir)


def test_unusable_cache_folder_means_memory_only(models, tmp_path):
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    (cache_dir / "snapshots").write_text("not a folder")  # as good as an unwritable folder, even for root
    eng = engine(models["llama"], cache_dir)
    a = eng.generate(req())
    b = eng.generate(req())
    eng.close()
    stats = eng.cache.disk.stats()
    assert stats["writable"] is False and len(stats["warnings"]) == 1
    assert b.report.source == "memory" and (a.tokens, a.logprobs) == (b.tokens, b.logprobs)
    assert (cache_dir / "snapshots").read_text() == "not a folder"


def _mount_tmpfs(path: Path, size: str) -> bool:
    if sys.platform != "linux" or os.geteuid() != 0 or not shutil.which("mount"):
        return False
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return r.returncode == 0


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.mark.linux_only  # mount -t tmpfs
def test_real_full_and_read_only_filesystem(models, tmp_path):
    """The same two faults on a real tmpfs (Linux, root, mount allowed; skipped elsewhere)."""
    mnt = tmp_path / "mnt"
    if not _mount_tmpfs(mnt, "400k"):
        pytest.skip("cannot mount a tmpfs here")
    try:
        cache_dir = mnt / "cache"
        eng = engine(models["llama"], cache_dir, disk_budget=64 << 20)
        a = eng.generate(req())  # two end snapshots (~320 KB each) do not both fit in 400 KB
        eng.generate(req(OTHER))
        eng.close()
        stats = eng.cache.disk.stats()
        assert stats["write_errors"] >= 1 and len(stats["warnings"]) == 1, stats
        assert_consistent(cache_dir)
        assert not list(cache_dir.rglob(".tmp-*"))
        n_entries = stats["entries"]

        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        eng = engine(models["llama"], cache_dir)
        r = eng.generate(req())
        eng.generate(req([{"role": "user", "content": "def add(a, b):"}]))
        eng.close()
        stats = eng.cache.disk.stats()
        assert stats["writable"] is False and len(stats["warnings"]) == 1, stats
        assert stats["entries"] == n_entries
        if n_entries:  # a read-only cache still serves what it holds
            assert r.report.source == "disk" and r.report.restored == r.report.prompt_tokens - 1
        assert (r.tokens, r.logprobs) == (a.tokens, a.logprobs)
    finally:
        _umount(mnt)


# ---------------------------------------------------------------------------------------------
# Model identity


def test_changed_model_file_never_uses_old_snapshots(models, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(models["llama"], folder)
    cache_dir = tmp_path / "cache"
    eng = engine(folder, cache_dir)
    eng.generate(req())
    old_key = eng.lm.key
    eng.close()
    # Same path, same size, other weights.
    other = build_model(tmp_path / "other", "llama", seed=7)
    shutil.copy(other / "model.safetensors", folder / "model.safetensors")
    eng = engine(folder, cache_dir)
    assert eng.lm.key != old_key
    assert eng.cache.disk.entries(eng.lm.key) == [] and eng.cache.disk.entries(old_key)
    r = eng.generate(req())
    eng.close()
    assert r.report.source is None and r.report.matched == 0 and r.report.declines == []
    assert (r.tokens, r.logprobs) == cold(folder)
    keys = {row["model_key"] for row in index_rows(cache_dir)}
    assert keys == {old_key, eng.lm.key}  # the old model's entries stay (up to the budget), unused


def test_second_instance_reads_but_does_not_write(models, tmp_path):
    cache_dir = tmp_path / "cache"
    owner = engine(models["llama"], cache_dir)
    owner.generate(req())
    assert owner.cache.disk.flush(10)
    other = engine(models["llama"], cache_dir)
    r = other.generate(req())
    other.generate(req(OTHER))
    other.close()
    assert other.cache.disk.stats()["writable"] is False and len(other.cache.disk.warnings) == 1
    assert r.report.source == "disk"
    owner.close()
    assert len(index_rows(cache_dir)) == 1
    assert_consistent(cache_dir)


# ---------------------------------------------------------------------------------------------
# Synthetic snapshots: real KV caches, no model. For the index, the budget and hostile files.

def test_save_load_round_trip_is_exact(tmp_path):
    snap = kv_snapshot(list(range(40)))
    d = DiskCache(tmp_path / "c", budget_bytes=1 << 30)
    d.save_async(snap)
    assert d.flush(10)
    [meta] = d.entries(KEY)
    assert d.entries("other") == []
    back = d.load(meta)
    for a, b in zip(snap.cache, back.full_cache()):
        assert type(a) is type(b) and a.offset == b.offset
        assert mx.array_equal(a.keys, b.keys).item() and mx.array_equal(a.values, b.values).item()
    d.close()
    d2 = DiskCache(tmp_path / "c", budget_bytes=1 << 30)  # the index survives a restart
    assert [m.tokens for m in d2.entries(KEY)] == [meta.tokens]
    d2.close()


def test_budget_evicts_least_recently_used(tmp_path):
    snaps = {name: kv_snapshot([i + 1] * 40, seed=i) for i, name in enumerate("ABCD")}
    size = 85_000  # ~ one file (2 layers x 2 x 40 x 2 x 64 x 4 bytes + header)
    d = DiskCache(tmp_path / "c", budget_bytes=int(3.5 * size))
    for name in "ABC":
        d.save_async(snaps[name])
        assert d.flush(10)
        time.sleep(0.01)
    assert d.stats()["entries"] == 3
    d.load(next(m for m in d.entries(KEY) if m.id == snaps["A"].meta.id))  # A is now most recent
    time.sleep(0.01)
    d.save_async(snaps["D"])
    assert d.flush(10)
    stats = d.stats()
    assert {m.id for m in d.entries(KEY)} == {snaps[n].meta.id for n in "ACD"}  # B went first
    assert stats["bytes"] <= stats["budget_bytes"] and stats["evictions"] == 1
    d.close()
    assert_consistent(tmp_path / "c")
    assert sum(p.stat().st_size for p in snapshot_files(tmp_path / "c")) <= int(3.5 * size)
    # A snapshot bigger than the whole budget is not written at all.
    d = DiskCache(tmp_path / "c", budget_bytes=1000)
    d.save_async(kv_snapshot([9] * 40))
    assert d.flush(10)
    assert d.stats()["skipped"] == 1 and d.stats()["entries"] == 0  # and the budget shrank: all evicted
    d.close()
    assert_consistent(tmp_path / "c")


def test_hostile_index_entries_are_rejected(tmp_path):
    root = tmp_path / "c"
    good = write_one_entry(root)
    victim = tmp_path / "x.safetensors"  # what "../x" would reach
    victim.write_bytes(b"precious")
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes(packs_used(root, good)[0].read_bytes())
    bad = [
        {**good, "id": "../x"},
        {**good, "id": "/etc/passwd"},
        {**good, "id": "..", "file": "../x.safetensors"},
        {**good, "id": "a" * 5000},
        {**good, "id": 7},
        {**good, "id": "sub/dir"},
        {**good, "id": "x", "tokens": "0123"},
        {**good, "id": "y", "tokens": [1, -2]},
        {**good, "id": "z", "tokens": [1] * (disk_format.MAX_TOKENS + 1)},
        {**good, "id": "w", "nbytes": -1},
        {**good, "id": "v", "blocks": ["../../x"]},
        {**good, "id": "u", "classes": ["os.system"]},
        {**good, "id": "t", "kind": "evil"},
        {**good, "id": "s", "exact_cuts": [10**9]},
        {**good, "id": "r", "blocks": ["f" * 40]},  # a block no pack holds
        {**good, "id": "o", "whole": "../x"},
        {**good, "id": "n", "forwards": [[0, 5, 2]]},
        {**good, "id": "q", "model_key": "../../k"},
        {**good, "id": "p", "exact_cuts": [3, 2]},
        "not an object",
        None,
        {**good},  # a duplicate id
    ]
    doc = json.loads((root / "index.json").read_text())
    [pack] = doc["packs"]
    bad_packs = [
        {**pack, "id": "../x"},
        {**pack, "id": "s"},  # a symlink out of the folder
        {**pack, "id": "m", "file_bytes": 10**15},
        {**pack, "id": "l", "sha256": "zz"},
        {**pack, "id": "j", "blocks": [[pack["end"] + 5, "a" * 40, 1]]},
        {**pack, "id": "i", "start": -1},
        "not a pack",
        {**pack},  # a duplicate id
    ]
    doc["entries"] = [good] + bad
    doc["packs"] = [pack] + bad_packs
    (root / "index.json").write_text(json.dumps(doc))
    os.symlink(outside, root / "snapshots" / "s.safetensors")  # a link out of the folder
    d = DiskCache(root, budget_bytes=1 << 30)
    assert [m.id for m in d.entries(KEY)] == [good["id"]]
    assert d.stats()["rejected_on_open"] == len(bad) + len(bad_packs)
    d.clear()
    d.close()
    assert victim.read_bytes() == b"precious" and outside.exists()
    assert index_rows(root) == [] and not snapshot_files(root)
    # An unreadable or absurd index file: the cache starts empty, it does not fail.
    for blob in (b"{not json", b"[]", json.dumps({"format": "x"}).encode(), b"\x00" * 100):
        (root / "index.json").write_bytes(blob)
        d = DiskCache(root, budget_bytes=1 << 30)
        assert d.stats()["entries"] == 0
        d.close()


def test_hostile_file_with_matching_checksum_is_refused(tmp_path):
    """Index and file both forged (checksums match): the header is still validated before use."""
    root = tmp_path / "c"
    good = write_one_entry(root)
    [path] = packs_used(root, good)
    header = disk_format.read_header(path)["__metadata__"]
    deep = {"l": [{"l": [{"l": [{"l": [{"l": [{"l": [{"l": [{"l": [{"l": [{"l": []}]}]}]}]}]}]}]}]}]}
    forgeries = {
        "missing tensor": dict(header, layers=json.dumps({"0": {"a": "nope"}, "1": {"a": "nope"}})),
        "deep structure": dict(header, layers=json.dumps({"0": deep, "1": deep})),
        "bad version": dict(header, version="99"),
        "no arrays": dict(header, layers=json.dumps({str(i): {"t": [{"v": None}, {"v": None}, {"v": 5}]}
                                                     for i in range(2)})),
        "other blocks": dict(header, pack=header["pack"].replace('"start":0', '"start":1')),
    }
    doc = json.loads((root / "index.json").read_text())

    def forge(data: bytes) -> None:
        path.write_bytes(data)
        doc["packs"] = [dict(doc["packs"][0], file_bytes=len(data), sha256=hashlib.sha256(data).hexdigest())]
        (root / "index.json").write_text(json.dumps(doc))

    for why, md in forgeries.items():
        mx.save_safetensors(str(path), {"x": mx.zeros((2,))}, metadata=md)
        forge(path.read_bytes())
        d = DiskCache(root, budget_bytes=1 << 30)
        [meta] = d.entries(KEY)
        with pytest.raises(SnapshotError):
            d.load(meta)
        assert d.entries(KEY) == [], why
        d.close()
        assert not path.exists(), why  # removed
    forge((2**60).to_bytes(8, "little") + b"{}")  # a header length claiming 2**60 bytes
    d = DiskCache(root, budget_bytes=1 << 30)
    with pytest.raises(SnapshotError, match="header length"):
        d.load(d.entries(KEY)[0])
    d.close()


# ---------------------------------------------------------------------------------------------
# Writing never delays the next reply


class Gate(WriterHooks):
    """Blocks the disk writer at `at` until `release()`: a write as slow as a test wants."""

    def __init__(self, at: str) -> None:
        self.at = at
        self.reached = threading.Event()
        self._open = threading.Event()

    def point(self, name: str) -> None:
        if name == self.at and not self._open.is_set():
            self.reached.set()
            self._open.wait()

    def release(self) -> None:
        self._open.set()


def test_a_blocked_disk_write_delays_no_reply(models, tmp_path):
    """Replies never wait for the writer: with a write blocked at its first step, a regenerate
    (memory hit) and a new prompt (cold prefill) both complete; close() then waits for the writes."""
    gate = Gate("begin")
    cache_dir = tmp_path / "cache"
    eng = Engine(use_disk=False, chunk=8)
    eng.load(str(models["llama"]))
    eng.cache = PromptCache(disk=DiskCache(cache_dir, budget_bytes=1 << 30, hooks=gate))
    first = eng.generate(req())  # queues the end snapshot; the writer blocks on it
    assert gate.reached.wait(30), "the writer never started the write"
    try:
        again = eng.generate(req())
        fresh = eng.generate(req(OTHER))
        stats = eng.cache.disk.stats()
    finally:
        gate.release()
    assert stats["pending"] >= 1 and stats["writes"] == 0, stats  # the writes were still in flight
    assert again.report.source == "memory" and again.report.restored == again.report.prompt_tokens - 1
    assert (again.tokens, again.logprobs) == (first.tokens, first.logprobs)
    assert fresh.report.source is None and fresh.tokens
    eng.close()
    assert eng.cache.disk.stats()["writes"] >= 2  # close() waited for them
    assert_consistent(cache_dir)


@pytest.mark.linux_only  # per-thread nice is a Linux notion
def test_writer_thread_runs_at_the_lowest_priority(models, tmp_path):
    eng = engine(models["llama"], tmp_path / "cache")
    eng.generate(req())
    assert eng.cache.disk.flush(10)
    tid = eng.cache.disk.store.thread.native_id
    stat = Path(f"/proc/self/task/{tid}/stat").read_text()
    nice = int(stat.rsplit(")", 1)[1].split()[16])  # field 19 of stat, counted after "(comm)"
    assert nice == disk_store.WRITER_NICE
    eng.close()


def test_cache_stats_carry_the_disk_tiers_own_stats_which_the_panel_shows(models, tmp_path):
    """The prompt cache's stats hold the disk tier's stats as they are, under "disk" (no prefixed
    copies); the debug panel's store box reads them from there."""
    from app.core.conversation.view_models import stats_rows

    eng = engine(models["llama"], tmp_path / "cache")
    eng.generate(req())
    assert eng.cache.disk.flush(10)
    stats = eng.cache_stats()
    assert stats["disk"] == eng.cache.disk.stats() and stats["disk"]["entries"] == 1
    assert not [k for k in stats if k.startswith("disk_")]
    assert stats_rows(stats)["disk"][0].startswith("1 snapshot, ")
    eng.close()
    memory_only = Engine(use_disk=False, chunk=8).cache_stats()
    assert memory_only["disk"] is None and stats_rows(memory_only)["disk"][0] == "no disk tier"


class Parked(WriterHooks):
    """Set when the writer reaches `point` (held / paused: it waits for the generation)."""

    def __init__(self, point: str) -> None:
        self.name, self.event = point, threading.Event()

    def point(self, name: str) -> None:
        if name == self.name:
            self.event.set()

    def wait(self, timeout: float) -> bool:
        return self.event.wait(timeout)


def test_writes_wait_while_a_generation_holds_them(models, tmp_path, monkeypatch):
    monkeypatch.setattr(dw, "MAX_HOLD_S", 3600.0)  # the hold's time limit is the next test's
    eng = engine(models["llama"], tmp_path / "cache")
    disk = eng.cache.disk
    disk.hooks = parked = Parked("held")
    disk.hold_writes()  # as if a generation were running (generate() nests its own hold)
    eng.generate(req())
    assert parked.wait(10)  # the writer has the snapshot and waits: nothing can be written now
    assert not list((tmp_path / "cache" / "snapshots").glob("*.safetensors"))
    assert disk.stats()["pending"] >= 1
    disk.release_writes()
    assert disk.flush(10)
    assert list((tmp_path / "cache" / "snapshots").glob("*.safetensors"))
    # flush() is never blocked by a hold (closing the app mid-generation must not hang)
    disk.hold_writes()
    eng.generate(req(OTHER))
    assert disk.flush(10) and disk.stats()["pending"] == 0
    disk.release_writes()
    eng.close()


def test_a_write_in_progress_pauses_for_a_generation(models, tmp_path, monkeypatch):
    """A hold that arrives mid-write parks the writer between arrays; the file completes after."""
    monkeypatch.setattr(dw, "MAX_HOLD_S", 3600.0)
    eng = engine(models["llama"], tmp_path / "cache")
    disk = eng.cache.disk
    started = threading.Event()
    original = disk_files.HashingWriter.write

    def write(self, b):
        n = original(self, b)
        if self.writes == 2 and not started.is_set():
            started.set()
            disk.hold_writes()  # a generation starts while this snapshot is half-written
        return n

    monkeypatch.setattr(disk_files.HashingWriter, "write", write)
    disk.hooks = parked = Parked("paused")
    eng.generate(req())
    assert started.wait(10)
    assert parked.wait(10)  # the writer stopped between arrays: the file cannot complete now
    snaps = tmp_path / "cache" / "snapshots"
    assert not list(snaps.glob("*.safetensors")) or all(p.name.startswith(TMP_PREFIX) for p in snaps.iterdir())
    assert disk.stats()["pending"] >= 1
    disk.release_writes()
    assert disk.flush(10)
    assert [p for p in snaps.iterdir() if not p.name.startswith(TMP_PREFIX)]
    eng.close()
    assert_consistent(tmp_path / "cache")
