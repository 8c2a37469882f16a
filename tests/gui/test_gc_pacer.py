"""The GC pacer: Python's collector runs on the GUI thread, and never in full while busy."""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any

import pytest

pytest.importorskip("PySide6")

from app.qt.window.gc_pacer import GcPacer  # noqa: E402
from tests.gui.driver import Node, cycles  # noqa: E402


def test_pacer_collects_young_garbage_on_its_own_thread_and_defers_full_collections_while_busy(
    qapp: Any, gc_collections: list[tuple[int, str, bool]]
) -> None:
    busy = {"now": True}
    pacer = GcPacer(busy=lambda: busy["now"], tick_ms=60_000, idle_s=0.2)  # the test calls tick()
    now = [1000.0]
    pacer.clock = lambda: now[0]  # the test moves time, no sleeping
    gc.set_threshold(100, 2, 2)  # small thresholds: every generation soon due
    gc.enable()
    pacer.start()
    assert pacer.active and not gc.isenabled()

    # Another thread allocating far past every threshold triggers no collection anywhere.
    garbage: list[list[weakref.ref[Node]]] = []
    t = threading.Thread(target=lambda: garbage.append(cycles(20_000)), name="allocator")
    t.start()
    t.join()
    refs = garbage[0]
    assert gc_collections == [] and all(r() is not None for r in refs[:100])
    assert pacer.due() == 0

    # Ticks on this thread while busy: young generations only, the full one deferred.
    gens = [pacer.tick()]
    assert all(r() is None for r in refs)  # the first young collection freed the cycles
    for _ in range(12):
        cycles(100)  # more garbage between ticks, as a streaming reply makes
        gens.append(pacer.tick())
    assert gens[0] == 0 and set(gens) <= {0, 1, None} and 1 in gens
    assert pacer.deferred > 0 and pacer.collections[2] == 0
    assert pacer.due() == 2  # a full collection is due and waiting
    # Idle again: the full collection waits idle_s more (the next reply often follows at once),
    # then runs, and nothing is due after it.
    busy["now"] = False
    assert pacer.tick() is None and pacer.due() == 2
    now[0] += 0.19
    assert pacer.tick() is None and pacer.due() == 2  # not yet idle_s
    now[0] += 0.02
    assert pacer.tick() == 2 and pacer.due() is None and pacer.tick() is None
    assert {name for _, name, _ in gc_collections} == {threading.current_thread().name}
    assert [g for g, _, _ in gc_collections] == [g for g in gens if g is not None] + [2]

    pacer.stop()
    assert not pacer.active and gc.isenabled()


def test_pacer_restores_a_disabled_collector_and_respects_threshold_zero(
    qapp: Any, gc_collections: list[tuple[int, str, bool]]
) -> None:
    gc.disable()
    pacer = GcPacer(busy=lambda: False, tick_ms=60_000)
    pacer.start()
    pacer.stop()
    assert not gc.isenabled()  # it was off before start(): stays off

    gc.set_threshold(0)  # the documented way to switch collection off entirely
    pacer.start()
    cycles(2_000)
    assert pacer.due() is None and pacer.tick() is None and gc_collections == []
    pacer.stop()


def test_pacer_ticks_from_its_timer(qtbot: Any, gc_collections: list[tuple[int, str, bool]]) -> None:
    gc.set_threshold(100, 10, 10)
    pacer = GcPacer(busy=lambda: False, tick_ms=10)
    pacer.start()
    try:
        refs = cycles(1_000)
        qtbot.waitUntil(lambda: refs[-1]() is None, timeout=5_000)
        assert pacer.collections[0] >= 1 and gc_collections
    finally:
        pacer.stop()
