"""One writer per data dir: the flock, a second process, SIGKILL, and the read-only fallback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from app.core.store.instance_lock import (
    InstanceLockedError,
    acquire_instance_lock,
    lock_holder_pid,
    require_instance_lock,
)
from app.core.store import DB_NAME, StoreError, open_app_store

ROOT = Path(__file__).resolve().parents[2]

HOLDER = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, sys.argv[2])
    from app.core.store import open_app_store
    store, lock = open_app_store(sys.argv[1])
    assert lock is not None and not store.read_only
    conv = store.create_conversation("held")
    u = store.add_message(conv.id, None, "user", "hello from the first instance")
    store.add_message(conv.id, u.id, "assistant", "", status="generating")
    print("LOCKED", conv.id, flush=True)
    time.sleep(60)
    """
)


def start_holder(tmp_path: Path, data: Path) -> tuple[subprocess.Popen, int]:
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    proc = subprocess.Popen([sys.executable, str(script), str(data), str(ROOT)], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    assert line.startswith("LOCKED"), line
    return proc, int(line.split()[1])


def kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()  # type: ignore[union-attr]


def test_lock_is_exclusive_and_released(tmp_path: Path) -> None:
    data = tmp_path / "data"
    lock = acquire_instance_lock(data)
    assert lock is not None and lock.held and lock_holder_pid(data) == os.getpid()
    assert acquire_instance_lock(data) is None  # flock: a second open file is refused, same process too
    lock.release()
    assert not lock.held
    lock.release()  # idempotent
    with acquire_instance_lock(data) as again:
        assert again is not None
    assert acquire_instance_lock(data) is not None


def test_second_process_is_refused_until_the_first_is_killed(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc, _ = start_holder(tmp_path, data)
    try:
        assert acquire_instance_lock(data) is None
        assert lock_holder_pid(data) == proc.pid
        with pytest.raises(InstanceLockedError, match=rf"already running \(process {proc.pid}\)"):
            require_instance_lock(data)
    finally:
        kill(proc)
    lock = acquire_instance_lock(data)  # the kernel released it with the process
    assert lock is not None
    lock.release()


def test_second_instance_opens_read_only_then_takes_over(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc, conv_id = start_holder(tmp_path, data)
    try:
        store, lock = open_app_store(data)
        assert lock is None and store.read_only
        path = store.active_path(conv_id)
        assert path[0].content == "hello from the first instance"
        assert path[1].status == "generating"  # the live instance's reply is left alone
        with pytest.raises(StoreError, match="read-only"):
            store.add_message(conv_id, path[1].id, "user", "from the second window")
        store.close()
    finally:
        kill(proc)
    store, lock = open_app_store(data)
    try:
        assert lock is not None and not store.read_only
        assert store.active_path(conv_id)[1].status == "interrupted"  # crash recovery on takeover
        assert store.tree_problems() == [] and store.integrity_check() == "ok"
    finally:
        store.close()
        lock.release()


def test_lock_is_released_when_opening_the_store_fails(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / DB_NAME).write_bytes(b"not a database at all" * 100)
    with pytest.raises(StoreError):
        open_app_store(data)
    lock = acquire_instance_lock(data)
    assert lock is not None
    lock.release()
