"""The disk tier's files: write a pack (temp file, fsync, rename, fsync the folder), read and
verify one, write the index atomically, delete what is no longer named.

`PackFiles` knows paths and the write order, nothing of the index's content: the owner of the
index (store.py) decides what to write and when, the engine thread reads packs through `read`
(reader.py). The invariants these steps keep are in tier.py's module doc.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

import mlx.core as mx

from engine.cache.disk.files import DamagedFile, HashingWriter, file_sha256, fsync, fsync_dir, read_regular, unlink
from engine.cache.disk.hooks import WriterHooks
from engine.cache.disk.pack import LoadedPack, PackRow, decode_pack, encode_pack
from engine.cache.snapshot import Snapshot
from engine.errors import SnapshotError

PACK_SUFFIX = ".safetensors"
TMP_PREFIX = ".tmp-"


class BadPack(SnapshotError):
    """A pack that is there but fails its checks: every snapshot using it is unusable."""


class PackMissing(SnapshotError):
    """A pack the index names is not on disk: the writing instance deleted it after this one (a
    reader) read its index. A reader keeps what comes before it (reader.py)."""


class PackFiles:
    """The pack folder and the index file of one cache root (see the module doc)."""

    def __init__(self, root: Path, pack_dir: Path, index_path: Path, hooks: WriterHooks,
                 pause: Callable[[], None] = lambda: None) -> None:
        self.root = root
        self.pack_dir = pack_dir
        self.index_path = index_path
        self.hooks = hooks
        self.pause = pause  # between the arrays of a write: a generation that started gets the CPU

    def use_hooks(self, hooks: WriterHooks) -> None:
        """Observe each step of a write with `hooks` from now on (tests)."""
        self.hooks = hooks

    def path(self, pack_id: str) -> Path:
        return self.pack_dir / f"{pack_id}{PACK_SUFFIX}"

    # -- write ---------------------------------------------------------------------------------
    def write(self, snap: Snapshot, row: PackRow, written: list[Path]) -> PackRow:
        """Write the pack `row` describes (temp file, fsync, rename, fsync the folder); the row
        with the file's size and checksum. Appends the file to `written` once renamed."""
        tensors, header_meta = encode_pack(snap, row)
        final = self.path(row.id)
        tmp = self.pack_dir / f"{TMP_PREFIX}{row.id}-{os.getpid()}{PACK_SUFFIX}"
        writer: Optional[HashingWriter] = None
        try:
            with open(tmp, "wb") as f:

                def on_write(n: int) -> None:
                    if n == 2:  # header written, data not yet: a partial file
                        if self.hooks.partial_file:
                            f.flush()
                        self.hooks.point("temp_partial")
                    self.pause()  # MLX writes one array per call: pause between them

                writer = HashingWriter(f, on_write)
                mx.save_safetensors(writer, tensors, metadata=header_meta)
                f.flush()
                self.pause()
                fsync(f.fileno())
                size = f.tell()
            sha256 = writer.hash.hexdigest() if writer.linear and writer.pos == size else file_sha256(tmp)
            self.hooks.point("temp_synced")
            os.replace(tmp, final)
            written.append(final)
            fsync_dir(self.pack_dir)
            self.hooks.point("renamed")
        except Exception as e:
            unlink(tmp)
            if writer is not None and writer.error is not None and not isinstance(e, OSError):
                raise writer.error from None  # the errno MLX wrapped away
            raise
        return replace(row, file_bytes=size, sha256=sha256)

    def write_index(self, blob: bytes) -> None:
        """Atomically replace index.json with `blob` (temp file, fsync, rename, fsync the root)."""
        tmp = self.root / f"{TMP_PREFIX}index-{os.getpid()}.json"
        try:
            with open(tmp, "wb") as f:
                f.write(blob)
                f.flush()
                fsync(f.fileno())
            self.hooks.point("index_tmp")
            os.replace(tmp, self.index_path)
            fsync_dir(self.root)
        except BaseException:
            unlink(tmp)
            raise

    def delete(self, pack_ids: list[str]) -> None:
        """Delete packs (call only once an index that no longer names them is on disk)."""
        for pid in pack_ids:
            unlink(self.path(pid))

    def delete_all(self) -> None:
        for name in os.listdir(self.pack_dir):
            if name.endswith(PACK_SUFFIX):
                unlink(self.pack_dir / name)

    # -- read ----------------------------------------------------------------------------------
    def read(self, row: PackRow, env: str) -> LoadedPack:
        """Read pack `row` and check it against its row (size, sha256, header, layers).
        `PackMissing` if the file is gone; `BadPack` if it fails a check."""
        try:
            # A regular file only, at most one byte past its row's size (more is a mismatch anyway).
            data = read_regular(self.path(row.id), row.file_bytes + 1)
        except FileNotFoundError:
            raise PackMissing(f"pack {row.id} missing") from None
        except DamagedFile as e:
            raise BadPack(f"pack {row.id}: {e}") from None
        except OSError as e:
            raise SnapshotError(f"pack {row.id}: cannot read: {e.strerror or e}") from None
        try:
            return decode_pack(data, row, env)
        except SnapshotError as e:
            raise BadPack(str(e)) from None
