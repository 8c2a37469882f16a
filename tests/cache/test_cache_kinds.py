"""The prompt cache's kinds and sources are StrEnums (engine/cache/kinds.py) that say on disk, in
reports and over HTTP exactly what the bare strings said: a cache folder written before them
(tests/disk_format3/, by the code of be18871) opens, restores bit for bit, and its index is
written back byte for byte."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import pytest

import engine.cache.disk.tier as tier
from engine.cache.disk.folder import read_index
from engine.cache.kinds import RestoreSource, SnapshotKind
from engine.engine import Engine
from engine.types import CacheReport, GenerationRequest, SamplerSettings
from tests.disk_format3 import make as fixture
from tests.tiny_models import build_model

OLD = Path(__file__).resolve().parents[1] / "disk_format3"


@pytest.fixture()
def old_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the committed folder, opened in the environment it was written in."""
    root = tmp_path / "cache"
    shutil.copytree(OLD, root, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    monkeypatch.setattr(tier, "compute_env", lambda: fixture.ENV)
    return root


def test_the_members_are_their_strings() -> None:
    assert [str(k) for k in SnapshotKind] == ["pre-last", "end", "boundary", "partial", "document"]
    assert json.dumps({"kind": SnapshotKind.PRE_LAST, "source": RestoreSource.DISK}) == '{"kind": "pre-last", "source": "disk"}'
    assert f"{RestoreSource.MEMORY} snapshot" == "memory snapshot" and RestoreSource("memory") is RestoreSource.MEMORY
    assert {"memory": 1}[RestoreSource.MEMORY] == 1 and SnapshotKind.END == "end"  # a stored report's plain strings


def test_an_index_written_before_the_enums_is_written_back_byte_for_byte() -> None:
    read = read_index(OLD / "index.json", OLD / "snapshots", fixture.ENV)
    assert read.rejected == 0 and read.damage is None
    kinds = [e.meta.kind for e in read.index]
    assert kinds == list(SnapshotKind) and all(type(k) is SnapshotKind for k in kinds)
    assert read.index.to_json() == (OLD / "index.json").read_bytes()


def test_a_cache_written_before_the_enums_opens_and_restores_bit_for_bit(old_folder: Path) -> None:
    disk = tier.DiskCache(old_folder, budget_bytes=1 << 30)
    try:
        stats = disk.stats()
        assert (stats["entries"], stats["rejected_on_open"], stats["orphans_removed_on_open"], disk.warnings) == (5, 0, 0, [])
        metas = {m.kind: m for m in disk.entries(fixture.KEY)}
        assert set(metas) == set(SnapshotKind)
        assert metas[SnapshotKind.DOCUMENT].documents == (fixture.DIGEST,)
        for kind, (first, n, cuts, whole) in fixture.SNAPSHOTS.items():
            meta = metas[SnapshotKind(kind)]
            assert (meta.tokens, meta.exact_cuts) == (tuple(range(first, first + n)), cuts)
            snap = disk.load(meta)
            keys, values = fixture.arrays(first, n)
            kv = snap.full_cache()[0]
            assert mx.array_equal(kv.keys[..., :n, :], keys).item() and mx.array_equal(kv.values[..., :n, :], values).item()
            if whole:
                assert all(mx.array_equal(a, b).item() for a, b in zip(snap.cache[1].state[0], fixture.whole(first)))
        assert disk.flush(30)
        assert disk.stats()["load_errors"] == 0
    finally:
        disk.close()


def test_reports_and_their_json_say_the_strings(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERBATIM_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "memo"))
    model = build_model(tmp_path_factory.mktemp("models") / "llama", "llama")
    eng = Engine(cache_dir=tmp_path / "cache", chunk=8)
    eng.load(str(model))
    req = GenerationRequest([{"role": "user", "content": "Say something about caches."}], SamplerSettings(max_tokens=6))
    eng.generate(req)
    again = eng.generate(req)
    eng.close()
    doc = json.loads(json.dumps(again.report.to_dict()))
    assert doc["source"] == "memory" and type(again.report.source) is RestoreSource
    assert {s["kind"] for s in doc["snapshots_stored"]} <= {str(k) for k in SnapshotKind}
    assert json.dumps(again.report.to_dict()) == json.dumps(CacheReport.from_dict(doc).to_dict())
