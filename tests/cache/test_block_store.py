"""The block store of the disk tier (engine/cache/blocks.py, engine/cache/disk/): snapshots as
manifests of shared blocks named by their history; what is kept apart, what is shared, what is
freed, and what reaches the disk.

Real MLX arrays, real files; engine-level tests use the tiny real models of tests/tiny_models.py.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache

from engine.cache.blocks import block_bounds, block_keys
from engine.cache.disk import format as disk_format
from engine.cache.disk import writer as dw
from engine.cache.disk.tier import DiskCache
from engine.cache.prompt_cache import PromptCache
from engine.cache.meta import SnapshotMeta
from engine.cache.snapshot import Snapshot, cache_nbytes, clone_cache, new_snapshot_id
from engine.engine import Engine
from engine.errors import SnapshotError
from engine.types import GenerationRequest, SamplerSettings

KEY = "k" * 32
ENV = "test env"
MESSAGES = [{"role": "user", "content": "Explain how a prompt cache works in two sentences. " * 3}]


pytestmark = pytest.mark.usefixtures("hash_memo_in_basetemp")


def kv_arrays(n: int, seed: int) -> list[tuple[mx.array, mx.array]]:
    mx.random.seed(seed)
    return [(mx.random.normal((1, 2, n, 16)), mx.random.normal((1, 2, n, 16))) for _ in range(2)]


def snapshot(tokens: list[int], forwards: list[tuple[int, int]], ends: tuple[int, ...],
             arrays: list[tuple[mx.array, mx.array]], exact_cuts: tuple[int, ...] = (), key: str = KEY) -> Snapshot:
    """A real two-layer KV snapshot with the given history and states."""
    cache = []
    for k, v in arrays:
        c = KVCache()
        c.update_and_fetch(k, v)
        cache.append(c)
    cache = clone_cache(cache)
    meta = SnapshotMeta(new_snapshot_id(), key, tuple(tokens), "end", exact_cuts, ("KVCache", "KVCache"), True,
                        cache_nbytes(cache), forwards=tuple(forwards), block_ends=ends)
    return Snapshot(meta, cache)


def same_state(a: list, b: list) -> bool:
    return all(mx.array_equal(x.keys, y.keys).item() and mx.array_equal(x.values, y.values).item()
               and x.offset == y.offset for x, y in zip(a, b))


def manifest(root: Path, sid: str) -> dict:
    return next(r for r in json.loads((root / "index.json").read_text())["entries"] if r["id"] == sid)


def pack_files(root: Path) -> set[str]:
    return {p.name for p in (root / "snapshots").iterdir()}


PREFILLED = [(0, 8), (8, 16)]
DECODED = [(0, 8)] + [(p, p + 1) for p in range(8, 16)]


def test_block_names_chain_tokens_history_and_key():
    base = SnapshotMeta("a", KEY, tuple(range(16)), "end", (8,), ("KVCache",), True, 0,
                        forwards=tuple(PREFILLED), block_ends=(8,))
    names = block_keys(base, ENV)
    assert block_bounds(base) == [(0, 8), (8, 16)] and len(set(names)) == 2
    assert block_keys(replace(base, id="b"), ENV) == names  # the id is not part of it
    decoded = block_keys(replace(base, forwards=tuple(DECODED)), ENV)
    assert decoded[0] == names[0] and decoded[1] != names[1]  # same tokens, other forwards
    assert block_keys(replace(base, model_key=KEY + "-ns-x"), ENV)[0] != names[0]
    assert block_keys(base, "other kernels")[0] != names[0]
    other = list(range(16))
    other[3] = 99
    assert block_keys(replace(base, tokens=tuple(other)), ENV)[1] != names[1]  # the chain carries it
    assert len(set(block_keys(replace(base, forwards=()), ENV)) & set(names)) == 0  # no history: never shared


def test_exact_and_decoded_blocks_of_the_same_tokens_are_kept_apart(tmp_path):
    """The same 16 tokens, once prefilled in two chunks, once prefilled to 8 and decoded one by
    one: their first block is shared, their second is not, and each restores its own bits."""
    tokens = list(range(1, 17))
    # exact_cuts that neither extends (so that one does not replace the other as redundant)
    prefilled = snapshot(tokens, PREFILLED, (8,), kv_arrays(16, 1), exact_cuts=(16,))
    a8 = [(k[..., :8, :], v[..., :8, :]) for k, v in kv_arrays(16, 1)]
    b8 = [(k[..., 8:, :], v[..., 8:, :]) for k, v in kv_arrays(16, 2)]
    decoded = snapshot(tokens, DECODED, (8,), [(mx.concatenate([a[0], b[0]], axis=2), mx.concatenate([a[1], b[1]], axis=2))
                                                for a, b in zip(a8, b8)], exact_cuts=(8,))
    d = DiskCache(tmp_path / "c", budget_bytes=1 << 30)
    for s in (prefilled, decoded):
        d.save_async(s)
        assert d.flush(10)
    m1, m2 = manifest(tmp_path / "c", prefilled.meta.id), manifest(tmp_path / "c", decoded.meta.id)
    assert m1["blocks"][0] == m2["blocks"][0] and m1["blocks"][1] != m2["blocks"][1]
    assert len(pack_files(tmp_path / "c")) == 2
    metas = {m.id: m for m in d.entries(KEY)}
    assert same_state(d.load(metas[prefilled.meta.id]).full_cache(), prefilled.cache)
    assert same_state(d.load(metas[decoded.meta.id]).full_cache(), decoded.cache)
    d.close()


def test_two_namespaces_never_share_blocks(llama, tmp_path):
    """The same prompt in two namespaces: each stores its own blocks (none in common) and
    restores its own snapshot."""
    eng = Engine(cache_dir=tmp_path / "c", chunk=8)
    eng.load(str(llama))
    for ns in ("alice", "bob"):
        eng.generate(GenerationRequest(MESSAGES, SamplerSettings(max_tokens=8), cache_namespace=ns))
    assert eng.cache.disk.flush(10)
    rows = json.loads((tmp_path / "c" / "index.json").read_text())["entries"]
    assert len(rows) == 2 and rows[0]["model_key"] != rows[1]["model_key"]
    assert not set(rows[0]["blocks"]) & set(rows[1]["blocks"])
    assert len(pack_files(tmp_path / "c")) == 4  # each its own prefill pack and decoded tail
    eng.close()
    again = Engine(cache_dir=tmp_path / "c", chunk=8)
    again.load(str(llama))
    r = again.generate(GenerationRequest(MESSAGES, SamplerSettings(max_tokens=8), cache_namespace="bob"))
    again.close()
    assert r.report.source == "disk" and r.report.restored == r.report.prompt_tokens - 1


def _a_and_b(root: Path) -> tuple[Snapshot, Snapshot, dict]:
    """A (16 tokens) and B (A's 16 with A's history, then 8 more) saved; the tier's stats."""
    tokens = list(range(1, 25))
    arrays = kv_arrays(24, 3)
    a = snapshot(tokens[:16], PREFILLED, (8,), [(k[..., :16, :], v[..., :16, :]) for k, v in arrays], exact_cuts=(8, 16))
    b = snapshot(tokens, PREFILLED + [(16, 24)], (8, 16), arrays, exact_cuts=(8,))  # B does not dominate A
    d = DiskCache(root, budget_bytes=1 << 30)
    for s in (a, b):
        d.save_async(s)
        assert d.flush(10)
    ma, mb = manifest(root, a.meta.id), manifest(root, b.meta.id)
    assert mb["blocks"][:2] == ma["blocks"]  # B names A's blocks: stored once
    stats = d.stats()
    assert stats["entries"] == 2 and stats["packs"] == 2 and stats["shared_bytes"] > 0
    assert stats["bytes_written"] < a.meta.nbytes + 0.6 * b.meta.nbytes  # B wrote a third of itself
    d.close()
    return a, b, stats


def test_a_block_shared_by_two_snapshots_outlives_the_one_removed(tmp_path):
    """A goes (declined, Clear of one entry): the pack it shares stays for B, which restores bit
    for bit; once B goes too, no pack is left."""
    root = tmp_path / "c"
    a, b, _ = _a_and_b(root)
    d = DiskCache(root, budget_bytes=1 << 30)
    d.remove(a.meta.id)
    assert d.flush(10)
    assert [m.id for m in d.entries(KEY)] == [b.meta.id]
    assert len(pack_files(root)) == 2  # nothing of B's was freed
    d.close()
    d = DiskCache(root, budget_bytes=1 << 30)  # and after a restart
    assert same_state(d.load(d.entries(KEY)[0]).full_cache(), b.cache)
    d.remove(b.meta.id)
    assert d.flush(10)
    assert pack_files(root) == set()  # no snapshot uses them: freed
    d.close()


def test_eviction_takes_the_end_of_a_chain_and_keeps_the_shared_blocks(tmp_path):
    """Over budget, the least recently used snapshot that frees something goes: B's own tail,
    not A (whose blocks B uses, so dropping A would free nothing); A still restores exactly."""
    root = tmp_path / "c"
    a, b, stats = _a_and_b(root)
    d = DiskCache(root, budget_bytes=stats["bytes"] - 1)
    assert d.flush(10)
    assert [m.id for m in d.entries(KEY)] == [a.meta.id] and d.stats()["evictions"] == 1
    assert len(pack_files(root)) == 1 and d.stats()["bytes"] <= stats["bytes"] - 1
    assert same_state(d.load(d.entries(KEY)[0]).full_cache(), a.cache)
    d.close()


def test_a_snapshot_larger_than_the_memory_budget_still_reaches_disk(llama, tmp_path):
    """The memory tier cannot hold it; the disk tier still gets it, and a restart restores it."""
    eng = Engine(cache_dir=tmp_path / "c", chunk=8, memory_budget=1000)
    eng.load(str(llama))
    first = eng.generate(GenerationRequest(MESSAGES, SamplerSettings(max_tokens=8)))
    assert eng.cache.stats()["memory_entries"] == 0  # too big for memory
    eng.close()
    assert json.loads((tmp_path / "c" / "index.json").read_text())["entries"]
    again = Engine(cache_dir=tmp_path / "c", chunk=8, memory_budget=1000)
    again.load(str(llama))
    r = again.generate(GenerationRequest(MESSAGES, SamplerSettings(max_tokens=8)))
    again.close()
    assert r.report.source == "disk" and r.report.restored == r.report.prompt_tokens - 1
    assert (r.tokens, r.logprobs) == (first.tokens, first.logprobs)


def test_writes_reach_disk_while_generations_run_back_to_back(tmp_path, monkeypatch):
    """A hold (a generation running) that never ends does not keep a queued write off the disk
    past MAX_HOLD_S: a server busy back to back still persists its replies."""
    monkeypatch.setattr(dw, "MAX_HOLD_S", 0.2)
    d = DiskCache(tmp_path / "c", budget_bytes=1 << 30)
    cache = PromptCache(disk=d)
    written = threading.Event()

    class Seen(dw.WriterHooks):
        def point(self, name: str) -> None:
            if name == "index_written":
                written.set()

    d.hooks = Seen()
    with cache.generation():
        cache.put(snapshot(list(range(1, 17)), PREFILLED, (8,), kv_arrays(16, 4)))
        with cache.generation():  # the next generation starts before this one ends
            assert written.wait(30)  # written while generations still hold the writer
            assert len(d.entries(KEY)) == 1
    d.close()
    assert json.loads((tmp_path / "c" / "index.json").read_text())["entries"]


def test_a_folder_of_the_old_format_is_removed_with_one_line(tmp_path, caplog):
    root = tmp_path / "c"
    (root / "snapshots").mkdir(parents=True)
    (root / "snapshots" / "x.safetensors").write_bytes(b"old")
    (root / "index.json").write_text(json.dumps({"format": "verbatim-prompt-cache", "version": 2, "entries": []}))
    with caplog.at_level("WARNING"):
        d = DiskCache(root, budget_bytes=1 << 30)
    assert d.stats()["old_format_removed"] is True and d.stats()["entries"] == 0
    assert [r.message for r in caplog.records if "older format" in r.message or "format 2" in r.message]
    assert not (root / "snapshots" / "x.safetensors").exists()
    d.save_async(snapshot(list(range(1, 17)), PREFILLED, (8,), kv_arrays(16, 5)))
    assert d.flush(10)
    d.close()
    assert json.loads((root / "index.json").read_text())["version"] == 3


def test_a_reader_whose_blocks_vanish_restores_the_longest_prefix_left(tmp_path):
    """A second instance reads while the first writes; the writer removes B's own pack (an
    eviction the reader has not seen yet): the reader restores the prefix of B still on disk
    (A's blocks, bit for bit) instead of dropping it."""
    root = tmp_path / "c"
    a, b, _ = _a_and_b(root)
    writer = DiskCache(root, budget_bytes=1 << 30)
    reader = DiskCache(root, budget_bytes=1 << 30)
    assert writer.stats()["writable"] and not reader.stats()["writable"]
    doc = json.loads((root / "index.json").read_text())
    own = [p for p in doc["packs"] if p["start"] == 16]
    assert len(own) == 1
    (root / "snapshots" / f"{own[0]['id']}.safetensors").unlink()
    meta_b = next(m for m in reader.entries(KEY) if m.id == b.meta.id)
    got = reader.load(meta_b)
    assert got.meta.length == 16 and got.meta.tokens == a.meta.tokens
    assert same_state(got.full_cache(), a.cache)
    # The same through the prompt cache: the plan for B's tokens ends on the prefix that is left.
    front = PromptCache(disk=reader)
    plan, cache = front.fetch(KEY, list(b.meta.tokens) + [99], "fast", ())
    assert plan.reuse == 16 and cache is not None and cache[0].offset == 16
    assert any("left on disk" in d for d in plan.declines), plan.declines
    reader.close()
    writer.close()


def test_a_reader_declines_a_snapshot_whose_later_pack_is_damaged_not_gone(tmp_path):
    """Only a pack that is not there (`PackMissing`) leaves a reader the prefix before it: B's own
    pack forged (its checksum matching, its layers naming a tensor it lacks: an error that says
    "missing") makes B unusable, and A, which does not use that pack, stays."""
    root = tmp_path / "c"
    a, b, _ = _a_and_b(root)
    doc = json.loads((root / "index.json").read_text())
    [own] = [p for p in doc["packs"] if p["start"] == 16]
    path = root / "snapshots" / f"{own['id']}.safetensors"
    header = disk_format.read_header(path)["__metadata__"]
    mx.save_safetensors(str(path), {"x": mx.zeros((2,))}, metadata=dict(header, layers=json.dumps({"0": {"a": "nope"}})))
    data = path.read_bytes()
    own.update(file_bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    (root / "index.json").write_text(json.dumps(doc))
    writer = DiskCache(root, budget_bytes=1 << 30)
    reader = DiskCache(root, budget_bytes=1 << 30)
    assert not reader.writable and {m.id for m in reader.entries(KEY)} == {a.meta.id, b.meta.id}
    meta_b = next(m for m in reader.entries(KEY) if m.id == b.meta.id)
    with pytest.raises(SnapshotError, match="missing tensor"):
        reader.load(meta_b)
    assert [m.id for m in reader.entries(KEY)] == [a.meta.id]
    assert same_state(reader.load(reader.entries(KEY)[0]).full_cache(), a.cache)
    reader.close()
    writer.close()
