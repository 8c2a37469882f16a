"""The run in progress (issue 50, item 5), without Qt: the generation keeps the reply being made's
run as far as it got (app/core/generation/live_run.py: the engine's RestoreEvent, then the
prefill's progress, then decode), tells it with `live_changed` once a batch, and None when the
reply ended; the debug panel's reading of it (`live_debug_vm`); a stopped run's report says what
it did and the seed it used."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from app.core import ops
from app.core.chat import Chat
from app.core.conversation.view_models import debug_vm
from app.core.generation.live_run import LiveRun, live_debug_vm
from app.core.store import Action, ChatSettings
from engine.types import CacheReport, PrefillProgress, RestoreEvent, SamplerSettings, TokenEvent
from tests.app.chat_helpers import close, load, make_chat, wait_for

LONG = "Why is the sky blue? Because of Rayleigh scattering of sunlight. " * 40  # ~700 tokens: ~45 chunks of 16


def record(chat: Chat) -> list[Optional[LiveRun]]:
    seen: list[Optional[LiveRun]] = []
    chat.generation.live_changed.connect(seen.append)
    return seen


def test_a_live_run_folds_the_restore_the_progress_and_decode() -> None:
    restore = RestoreEvent(CacheReport(prompt_tokens=100, restored=40, source="memory", seed=9),
                           [[40, 64], [64, 96], [96, 99], [99, 100]])
    run = LiveRun(7, Action.REGENERATE)
    assert run.phase == "restoring" and run.report is None
    run = run.advanced([restore, PrefillProgress(40, 100)])
    assert (run.phase, run.done, run.total, run.planned_tokens) == ("prefilling", 40, 100, 60)
    assert (run.report.restored, run.report.source, run.report.chunks, run.report.prefill_tokens) == (40, "memory", [], 0)
    run = run.advanced([PrefillProgress(64, 100), PrefillProgress(96, 100)])
    assert (run.report.chunks, run.report.prefill_tokens) == ([[40, 64], [64, 96]], 56)
    run = run.advanced([TokenEvent(0, 5, -0.1, "a"), TokenEvent(1, 6, -0.2, "b")])
    assert run.phase == "decoding" and run.report.prefill_tokens == 60 and run.report.chunks == restore.planned
    assert run.advanced([TokenEvent(2, 7, -0.3, "c")]) == run  # no change with every token
    assert restore.report.chunks == []  # the event is left as it is


def test_the_run_in_progress_is_the_restore_then_the_prefill_then_the_final_report(chat: Chat) -> None:
    seen = record(chat)
    ops.send(chat, LONG)
    pending = chat.generation.pending
    assert seen == [LiveRun(pending.reply_id, Action.SEND)]  # at once: restoring
    (done,) = wait_for(chat, chat.generation.finished)
    final = done.result.report
    assert seen[-1] is None and chat.generation.live is None  # the reply ended: no run in progress
    runs = [r for r in seen[:-1] if r is not None and r.restore is not None]
    assert runs and all(r.reply_id == pending.reply_id for r in runs)
    first = runs[0].report
    # What the restore did is the final report's: restored, from where, the layers, the declines.
    assert (first.restored, first.source, first.layer_offsets, first.declines, first.seed) == (
        final.restored, final.source, final.layer_offsets, final.declines, final.seed)
    assert runs[0].restore.planned == final.chunks and runs[0].planned_tokens == final.prefill_tokens
    prefilling = [r for r in runs if r.phase == "prefilling" and r.done > final.restored]
    assert prefilling, [(r.phase, r.done) for r in runs]  # the prefill's progress, as it went
    for r in prefilling:
        now = r.report
        assert now.prefill_tokens == r.done - final.restored and now.chunks == final.chunks[: len(now.chunks)]
    dones = [r.done for r in runs]
    assert dones == sorted(dones) and runs[-1].phase == "decoding"
    assert (runs[-1].report.chunks, runs[-1].report.prefill_tokens) == (final.chunks, final.prefill_tokens)
    # The panel's reading of it while it goes on, then of the final report.
    vm = chat.conversation.vms[-1]
    d = live_debug_vm(vm, prefilling[0])
    assert "in progress: prefilling" in d.title and f"{prefilling[0].done:,} / {final.prompt_tokens:,}" in d.title
    assert d.rows["prefill_tokens"] == f"{prefilling[0].report.prefill_tokens:,} of {final.prefill_tokens:,} planned"
    assert d.rows["chunks"].startswith(f"{len(prefilling[0].report.chunks)} of {len(final.chunks)} made · planned ")
    assert d.rows["restored"] == debug_vm(vm).rows["restored"] and d.rows["seed"] == str(final.seed)
    assert d.rows["ttft"] == d.rows["snapshots"] == "–"
    assert "in progress" not in debug_vm(vm).title


def test_a_regenerate_shows_what_it_restored_from_memory_while_it_runs(chat: Chat) -> None:
    ops.send(chat, "The capital of France is")
    (first,) = wait_for(chat, chat.generation.finished)
    seen = record(chat)
    ops.regenerate(chat, fresh=False)
    pending = chat.generation.pending
    (again,) = wait_for(chat, chat.generation.finished)
    final = again.result.report
    restored = next(r for r in seen if r is not None and r.restore is not None)
    assert restored.reply_id == pending.reply_id and restored.action is Action.REGENERATE
    assert restored.report.restored == final.restored == final.prompt_tokens - 1 and restored.report.source == "memory"
    d = live_debug_vm(chat.conversation.vms[-1], restored)
    assert " · regenerated · in progress: " in d.title and d.rows["source"] == "memory"
    assert d.rows["chunks"].startswith(f"0 of 1 made · planned 1 forward: [{final.prompt_tokens - 1}, {final.prompt_tokens})")


def test_a_run_stopped_mid_prefill_reports_its_forwards_their_tokens_and_its_random_seed(
    tmp_path: Path, tiny_model: Path
) -> None:
    c = make_chat(tmp_path, ChatSettings(sampler=SamplerSettings(temperature=0.9, max_tokens=50), random_seed=True))
    load(c, tiny_model)
    ops.send(c, LONG * 5)  # ~3,500 tokens: the stop comes long before the prefill ends
    pending = c.generation.pending
    seed = pending.request.sampler.seed
    assert seed != 0
    at: Any = wait_for(c, c.generation.live_changed, lambda r: r is not None and r.phase == "prefilling"
                       and r.done > r.report.restored)[0]
    assert ops.stop(c)
    (done,) = wait_for(c, c.generation.finished)
    r = done.result.report
    assert done.result.finish_reason == "cancelled" and not done.result.tokens  # stopped inside prefill
    assert r.prefill_tokens == sum(b - a for a, b in r.chunks) > 0 and r.chunks[: len(at.report.chunks)] == at.report.chunks
    assert r.prefill_tokens < r.prompt_tokens and r.seed == done.result.seed == seed
    vm = c.conversation.vms[-1]
    rows = debug_vm(vm).rows
    assert rows["seed"] == str(seed) and rows["prefill_tokens"] == str(r.prefill_tokens)
    assert rows["chunks"].startswith(f"{len(r.chunks)} forward")
    assert c.session.message(vm.id).seed == seed
    close(c)
