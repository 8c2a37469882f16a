"""The engine executor: one thread owns the Engine; jobs run there, in order."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engine.engine import Engine
from engine.errors import EngineError
from engine.executor import EngineExecutor


def test_jobs_run_in_order_on_the_one_thread_that_created_the_engine(tmp_path: Path) -> None:
    made_on: list[int] = []

    def make() -> Engine:
        made_on.append(threading.get_ident())
        return Engine(cache_dir=tmp_path, use_disk=False)

    ex = EngineExecutor(make)
    order: list[int] = []
    futures = [ex.submit(lambda e, i=i: (order.append(i), threading.get_ident(), e)[1:]) for i in range(5)]
    results = [f.result(timeout=30) for f in futures]
    assert order == [0, 1, 2, 3, 4]
    assert {ident for ident, _ in results} == set(made_on) and len(made_on) == 1
    assert len({id(e) for _, e in results}) == 1
    assert ex.shutdown(timeout=30)


def test_an_engine_that_cannot_start_fails_every_job_with_the_reason(tmp_path: Path) -> None:
    def make() -> Engine:
        raise EngineError("cache folder is not writable")

    ex = EngineExecutor(make)
    with pytest.raises(EngineError, match="could not start: cache folder is not writable"):
        ex.submit(lambda e: e.info).result(timeout=30)
    assert ex.shutdown(timeout=30)
