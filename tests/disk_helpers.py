"""What a prompt cache folder holds, read from its files: the index's manifests and packs, the
pack files, and the check that index and files agree."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

KEY = "k" * 32  # the model key of the hand-made snapshots (tests/engine_helpers.kv_snapshot)


def index_rows(cache_dir: Path) -> list[dict[str, Any]]:
    """The manifests (one per snapshot) in the index."""
    return json.loads((cache_dir / "index.json").read_text())["entries"]


def pack_rows(cache_dir: Path) -> list[dict[str, Any]]:
    return json.loads((cache_dir / "index.json").read_text())["packs"]


def snapshot_files(cache_dir: Path) -> list[Path]:
    """The pack files (each holds one save's new blocks and its snapshot's whole pieces)."""
    return sorted((cache_dir / "snapshots").iterdir())


def packs_used(cache_dir: Path, row: dict[str, Any]) -> list[Path]:
    """The pack files a manifest's blocks and whole pieces are in."""
    where = {k: p["id"] for p in pack_rows(cache_dir) for _, k, _ in p["blocks"]}
    ids = {where[k] for k in row["blocks"]} | ({row["whole"]} if row["whole"] else set())
    return sorted(cache_dir / "snapshots" / f"{i}.safetensors" for i in ids)


def assert_consistent(cache_dir: Path) -> None:
    """Index and files agree: every pack's file exists with its size and checksum, every block a
    manifest names is in a listed pack, every pack is used by some manifest; no other file."""
    rows, packs = index_rows(cache_dir), pack_rows(cache_dir)
    assert {p.name for p in snapshot_files(cache_dir)} == {f"{p['id']}.safetensors" for p in packs}
    for p in packs:
        data = (cache_dir / "snapshots" / f"{p['id']}.safetensors").read_bytes()
        assert len(data) == p["file_bytes"]
        assert hashlib.sha256(data).hexdigest() == p["sha256"]
    used = {f.name for r in rows for f in packs_used(cache_dir, r)}  # KeyError: a block not on disk
    assert used == {f"{p['id']}.safetensors" for p in packs}, "a pack no snapshot uses was kept"
