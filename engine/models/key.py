"""Model identity: one stable key per (weights content, quantization, cache-affecting options).

The prompt cache files snapshots under this key, so a changed, replaced or re-quantized model
can never reuse another model's snapshots. Identity is content, not path: the same weights
copied elsewhere get the same key; the same path with new weights gets a new one. Hashing
gigabytes is slow, so file hashes are memoized by (path, size, mtime_ns) in a small JSON file
under the cache root.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Optional

from engine.errors import ModelError
from engine.paths import cache_root
from engine.types import CancelToken, Progress

HASH_MEMO = "file_hashes.json"
KEY_VERSION = 1  # bump if what goes into the key changes


def _load_memo(path: Path) -> dict[str, Any]:
    try:
        memo = json.loads(path.read_text())
        return memo if isinstance(memo, dict) else {}
    except (OSError, ValueError):
        return {}  # missing or corrupt memo: just re-hash


def _save_memo(path: Path, memo: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".hashes.", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(memo, f)
        os.replace(tmp, path)  # concurrent writers may lose an entry, never corrupt the file
    except OSError:
        pass  # a read-only cache only costs speed


def cached_file_hash(path: Path, progress: Optional[Progress] = None, cancel: Any = None) -> str:
    """SHA-256 of a file's content, memoized by (resolved path, size, mtime_ns)."""
    path = Path(path).resolve()
    st = path.stat()
    memo_path = cache_root() / HASH_MEMO
    memo = _load_memo(memo_path)
    entry = memo.get(str(path))
    if isinstance(entry, dict) and entry.get("size") == st.st_size and entry.get("mtime_ns") == st.st_mtime_ns:
        digest = entry.get("sha256")
        if isinstance(digest, str) and len(digest) == 64:
            return digest
    digest = file_sha256(path, progress, cancel)
    memo = _load_memo(memo_path)  # re-read: another process may have added entries meanwhile
    memo[str(path)] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
    _save_memo(memo_path, memo)
    return digest


def weight_files(folder: Path) -> list[Path]:
    return sorted(Path(folder).glob("*.safetensors"))


def engine_options(folder: Path) -> dict[str, Any]:
    """Cache-affecting options stored beside a model's weights (verbatim.json), e.g. KV quantization."""
    f = Path(folder) / "verbatim.json"
    if not f.is_file():
        return {}
    try:
        opts = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"bad {f}: {e}") from e
    if not isinstance(opts, dict):
        raise ModelError(f"bad {f}: not a JSON object")
    return opts


def model_key(folder: Path | str, options: Optional[dict[str, Any]] = None) -> str:
    """Stable hex key for the model in `folder` plus the cache-affecting `options`.

    Covers the content of every *.safetensors file, config.json (architecture, dtype and
    quantization: anything that changes what a forward computes), and `options` (kv_bits,
    kv_group_size, chunk size, ...). A folder's verbatim.json supplies default options.
    """
    folder = Path(folder)
    files = weight_files(folder)
    if not files:
        raise ModelError(f"no *.safetensors weights in {folder}")
    config: dict[str, Any] = {}
    cfg_path = folder / "config.json"
    if cfg_path.is_file():
        try:
            config = json.loads(cfg_path.read_text())
        except ValueError:
            config = {}
    opts = {**engine_options(folder), **(options or {})}
    ident = {
        "v": KEY_VERSION,
        "weights": [[f.name, cached_file_hash(f)] for f in files],
        "quantization": config.get("quantization"),
        "dtype": config.get("torch_dtype"),
        "config": config,
        "options": opts,
    }
    blob = json.dumps(ident, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def file_sha256(path: Path, progress: Optional[Progress] = None, cancel: Optional[CancelToken] = None,
                span: tuple[float, float] = (0.0, 1.0)) -> str:
    """Content hash of a file, read in 8 MiB blocks (cancellable, with progress)."""
    h = hashlib.sha256()
    total = max(path.stat().st_size, 1)
    done, shown = 0, -1.0
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            h.update(block)
            done += len(block)
            if cancel is not None:
                cancel.check("hashing cancelled")
            if progress and done / total - shown >= 0.1:  # ~10 updates, whatever the size
                shown = done / total
                progress(span[0] + (span[1] - span[0]) * shown, "hashing")
    return h.hexdigest()
