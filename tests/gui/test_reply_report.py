"""What the window says of a reply's run (pytest-qt, offscreen, the tiny real model): the footer,
the status line and the debug panel give one meaning to "restored", say why a restore or a
prefill rate is missing, show the run picked in the runs menu (also after a restart), verify
against a cold run, clear the cache, and show a disk problem once."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel

from app.core import ops
from app.core.conversation.view_models import restored_of
from app.qt.window.window import MainWindow
from tests.gui.driver import LONG, LONG_PROMPT, click, replies, send, status_said, wait_idle, watch

pytestmark = pytest.mark.gui



def test_debug_panel_verify_and_clear_cache(qtbot: Any, open_window: Callable[..., MainWindow]) -> None:
    w = open_window()
    send(qtbot, w, "Why is the sky blue?")
    w.menus.debug_action.trigger()
    assert w.debug_panel.isVisible()
    qtbot.waitUntil(lambda: w.debug_panel.value("entries") not in ("–", "0"), timeout=LONG)
    qtbot.mouseClick(w.debug_panel.verify_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.chat.cold_runs.verifying, timeout=LONG)
    assert w.debug_panel.value("verify").startswith("✓ identical")
    qtbot.mouseClick(w.debug_panel.clear_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.chat.link.stats.get("memory_entries") == 0, timeout=LONG)
    assert w.debug_panel.value("entries") == "0"
    # After a clear, regenerate is a cold prefill but still reproduces the reply exactly.
    click(qtbot, w, "regenerateButton")
    wait_idle(qtbot, w)
    assert watch(w).finished.saved.outcome.comparison.identical is True
    assert watch(w).finished.saved.duplicate_of == replies(w)[-1].id
    assert w.debug_panel.value("restored").startswith("0 / ")  # this run's report


def test_disk_cache_problem_is_shown_once_in_the_window(
    qtbot: Any, open_window: Callable[..., MainWindow], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    (data / "cache").mkdir(parents=True)
    (data / "cache" / "snapshots").write_text("not a folder")  # the disk tier cannot write here
    w = open_window(data, max_tokens=4)
    send(qtbot, w, "hello")
    banner = w.findChild(QLabel, "banner")
    assert banner.isVisible() and "Prompt cache" in banner.text()
    assert w.session.store.get_message(replies(w)[-1].id).cache_report["warnings"]
    send(qtbot, w, "again")
    assert w.session.store.get_message(replies(w)[-1].id).cache_report["warnings"] == []  # told once


def test_restored_means_of_the_prompt_in_footer_status_and_debug_panel(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    w = open_window()
    send(qtbot, w, "Why is the sky blue?")
    send(qtbot, w, "And why is the sunset red?")  # restores the first turn's prefix
    reply = replies(w)[-1]
    r = reply.report
    assert r is not None and r.restored > 0 and r.stored is not None and r.stored != r.prompt_tokens
    shown = f"{r.restored} / {r.prompt_tokens}"
    assert f"restored {shown}" in w.chat_view.widget_for(reply.id).footer.text()
    assert f"restored {shown}" in status_said(w)
    w.debug_panel.show()
    w.chat.conversation.select(reply.id)
    assert w.debug_panel.value("restored") == shown  # the same numbers, the same meaning
    keys = [label.text() for label in w.debug_panel.findChildren(QLabel, "debugKey")]
    assert "Restored" in keys and "Snapshot length" in keys and "Restored / stored" not in keys
    assert w.debug_panel.value("snapshot_length") == str(r.stored)


def test_no_runs_button_where_there_are_no_runs(qtbot: Any, open_window: Callable[..., MainWindow]) -> None:
    from app.core import ops

    w = open_window()
    send(qtbot, w, "Why is the sky blue?", wait=False)
    qtbot.waitUntil(lambda: w.chat.generation.pending is not None, timeout=LONG)
    streaming = w.chat_view.widget_for(w.chat.generation.pending.reply_id)
    assert not streaming.runs_button.isVisibleTo(streaming)  # a reply while it streams: no runs yet
    qtbot.waitUntil(lambda: not w.chat.generation.busy, timeout=LONG)
    user = w.chat_view.widget_for(next(vm.id for vm in w.chat.conversation.vms if vm.role == "user"))
    assert not user.runs_button.isVisibleTo(user)  # a user message never has runs
    # The footer row adds no height: the message is its role line and body (and margins) only.
    m = user.layout().contentsMargins()
    head = user.edit_button.sizeHint().height()
    assert user.sizeHint().height() <= m.top() + head + user.layout().spacing() + user.body.height() + m.bottom() + 2
    reply = replies(w)[-1]
    ops.regenerate(w.chat, fresh=False)  # the same tokens: a second run of the same reply
    qtbot.waitUntil(lambda: not w.chat.generation.busy, timeout=LONG)
    widget = w.chat_view.widget_for(reply.id)
    assert widget.runs_button.isVisibleTo(widget) and widget.runs_button.text() == "2 runs"


# -- 8e. a restore of 0 with a matched prefix says why ----------------------------------------------------
def test_a_new_chat_that_matched_a_prefix_but_restored_none_says_why(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    w = open_window(max_tokens=4)
    send(qtbot, w, "Why is the sky blue?")
    w.conversations.new()
    send(qtbot, w, "Name three rivers.")  # the template's head is shared with the first chat, no more
    r = replies(w)[-1].report
    assert r is not None and r.matched > 0 and r.restored == 0 and not r.declines, (r.matched, r.restored)
    w.debug_panel.show()
    assert w.debug_panel.value("restored") == (f"0 / {r.prompt_tokens} (no exact cut inside the {r.matched} "
                                               "matched tokens: exact mode restores only where a cold prefill "
                                               "of this prompt cuts too)")
    assert w.debug_panel.declines.text() == "none"


# -- 8g. a prefill with no rate says why ------------------------------------------------------------------
def test_a_regenerate_that_ran_a_few_tokens_says_why_its_prefill_has_no_rate(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    w = open_window(max_tokens=4)
    send(qtbot, w, "Why is the sky blue?")
    ops.regenerate(w.chat, fresh=False)  # the prompt but its last token restored: one token run
    wait_idle(qtbot, w)
    reply = w.chat.conversation.selected
    r = reply.runs[-1].report
    assert r.prefill_tokens < 16 and r.restored > 0
    w.debug_panel.show()
    text = w.debug_panel.value("prefill_tps")
    assert text.startswith(f"no rate: {r.prefill_tokens} token") and f"({r.restored:,} restored)" in text
    assert text.endswith("too few (under 16) to measure prefill speed")


# -- 11. the wording that misled ------------------------------------------------------------------
def test_a_one_token_prefill_shows_no_rate_and_the_title_no_database_id() -> None:
    from app.core.conversation.view_models import debug_vm, message_vm, prefill_rate_text
    from app.core.store import Message, ReplyOutcome, Run
    from engine.types import CacheReport

    regen = CacheReport(prompt_tokens=85, restored=84, prefill_tokens=1, prefill_tps=1.6)
    cold = CacheReport(prompt_tokens=85, restored=0, prefill_tokens=85, prefill_tps=412.0)
    # Not "1.6 tok/s": no slow prefill; the reason there is no rate (issue 39), and the time it took.
    said = "no rate: 1 token run in 625 ms (84 restored), too few (under 16) to measure prefill speed"
    assert prefill_rate_text(regen) == said
    assert prefill_rate_text(cold) == "412.0 tok/s"
    m = Message(id=7, conversation_id=1, parent_id=6, role="assistant", content="hi", created_at=0.0, status="complete",
                tokens=[1, 2])
    vm = message_vm(m, [7], [Run(1, 7, 0.0, 1, "stop", 2, regen, ReplyOutcome())])
    d = debug_vm(vm)
    assert d.rows["prefill_tps"] == said and "#7" not in d.title


def test_prefill_progress_shows_the_rate_and_the_time_left(qtbot: Any, open_window: Callable[..., MainWindow]) -> None:
    w = open_window(max_tokens=4, batch_interval=0.0, chunk=16)  # every progress event shown
    seen: list[tuple[str, str]] = []

    def look(reply_id: int, done: int, total: int) -> None:  # after the window's own subscriber
        body = w.chat_view.widget_for(reply_id).body.toPlainText()
        seen.append((status_said(w), body))

    w.chat.generation.prefilled.connect(look)
    send(qtbot, w, LONG_PROMPT)
    line = re.compile(r"Reading the prompt: [\d,]+ / [\d,]+ · [\d.,]+ tok/s · about \d+ (s|min) left")
    assert any(line.fullmatch(status) and line.fullmatch(body) for status, body in seen), seen[:5]
    assert seen[0][0].startswith("Reading the prompt: 0 / ")  # no rate from a single event


# -- 3. one selected run drives the footer and the debug panel ---------------------------------
def test_the_run_picked_in_the_runs_menu_is_the_one_the_footer_badge_and_debug_panel_show(
    qtbot: Any, open_window: Callable[..., MainWindow]  # noqa: F811
) -> None:
    w = open_window()
    send(qtbot, w, "Explain how a prompt cache works in two sentences.")
    reply = replies(w)[-1]
    first = watch(w).finished.result.report
    for _ in range(2):
        ops.regenerate(w.chat, fresh=False)
        wait_idle(qtbot, w)
    assert replies(w)[-1].id == reply.id  # identical: three runs of one reply
    w.debug_panel.show()
    widget = w.chat_view.widget_for(reply.id)
    assert "run 3 of 3" in w.debug_panel.title.text() and widget.identity.isVisible()
    runs = widget.runs_button.menu().actions()
    runs[0].trigger()
    widget = w.chat_view.widget_for(reply.id)
    qtbot.mouseClick(widget.body, Qt.MouseButton.LeftButton)  # a click on the reply: the same run stays
    assert widget.footer.text().startswith("run 1 of 3 · ") and f"restored 0 / {first.prompt_tokens}" in widget.footer.text()
    assert "run 1 of 3" in w.debug_panel.title.text()
    assert w.debug_panel.value("restored").startswith("0 / ")
    assert not widget.identity.isVisible()  # the original run is compared with nothing
    assert [a.isChecked() for a in widget.runs_button.menu().actions()] == [True, False, False]
    ops.regenerate(w.chat, fresh=False)  # a new run: the latest is shown again
    wait_idle(qtbot, w)
    widget = w.chat_view.widget_for(reply.id)
    assert widget.footer.text().startswith("run 4 of 4 · ") and "run 4 of 4" in w.debug_panel.title.text()


# -- 8f. the run picked is remembered at restart ---------------------------------------------------------
def test_the_run_picked_in_the_runs_menu_is_shown_again_after_a_restart(
    qtbot: Any, open_window: Callable[..., MainWindow], tmp_path: Path
) -> None:
    data = tmp_path / "kept"
    w = open_window(data_dir=data, max_tokens=4)
    send(qtbot, w, "Why is the sky blue?")
    reply = replies(w)[-1]
    ops.regenerate(w.chat, fresh=False)  # the same tokens: a second run of the reply
    wait_idle(qtbot, w)
    widget = w.chat_view.widget_for(reply.id)
    assert widget.runs_button.text() == "2 runs"
    widget.runs_button.menu().actions()[0].trigger()  # the first run picked
    assert w.chat_view.widget_for(reply.id).footer.text().startswith("run 1 of 2 · ")
    w.close()
    again = open_window(data_dir=data, max_tokens=4)
    widget = again.chat_view.widget_for(reply.id)
    assert widget is not None and widget.footer.text().startswith("run 1 of 2 · ")
    assert [a.isChecked() for a in widget.runs_button.menu().actions()] == [True, False]
    again.debug_panel.show()
    assert "run 1 of 2" in again.debug_panel.title.text()


# -- issue 50, item 5: the run in progress, then the final report -------------------------------------
def test_the_debug_panel_shows_the_run_in_progress_then_its_final_report(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    w = open_window(max_tokens=4, batch_interval=0.0, chunk=16)  # every event shown: ~190 forwards
    w.menus.debug_action.trigger()
    panel = w.debug_panel
    shown: list[dict[str, str]] = []

    def look(live: Any) -> None:  # after the panel's own subscriber: what it shows for this run
        if live is not None:
            keys = ("restored", "source", "prefill_tokens", "chunks", "seed", "snapshots")
            shown.append({"title": panel.title.text(), "layers": str(panel.layers.rowCount()),
                          **{k: panel.value(k) for k in keys}})

    w.chat.generation.live_changed.connect(look)
    send(qtbot, w, LONG_PROMPT * 3, wait=False)
    started = panel.title.text()  # the reply is selected, nothing of its run came yet
    # The panel shows the restore and then a progress value before the reply ends (no sleep: the
    # wait ends on what the panel shows, or fails when the reply ended first).
    prefilling = re.compile(r"in progress: prefilling ([\d,]+) / ([\d,]+) tokens")
    qtbot.waitUntil(lambda: any((m := prefilling.search(s["title"])) and m.group(1) != "0" for s in shown)
                    or not w.chat.generation.busy, timeout=LONG)
    assert w.chat.generation.busy, "the reply ended before the panel showed its progress"
    wait_idle(qtbot, w)
    final = watch(w).finished.result.report
    assert "in progress: restoring the prompt cache" in started  # at once, never blank
    assert shown and all("no cache report" not in s["title"] for s in shown)
    during = [s for s in shown if prefilling.search(s["title"])]
    assert during and during[0]["restored"].startswith(restored_of(final))
    assert during[0]["layers"] == str(len(final.layers)) and during[0]["seed"] == str(final.seed)
    planned = f"of {final.prefill_tokens:,} planned"
    assert all(s["prefill_tokens"].endswith(planned) and s["snapshots"] == "–" for s in during)
    made = [int(s["prefill_tokens"].split(" of ")[0].replace(",", "")) for s in during]
    assert made == sorted(made) and made[-1] > 0
    n = len(final.chunks)  # the forwards made so far of those planned, as they were made
    assert all(f" of {n} made · planned {n} forwards: " in s["chunks"] for s in during)
    forwards = [int(s["chunks"].split(" of ")[0]) for s in during]
    assert forwards == sorted(forwards) and forwards[0] < n
    # Then the final report replaces it.
    assert "in progress" not in panel.title.text() and panel.value("prefill_tokens") == str(final.prefill_tokens)
    assert panel.value("chunks").startswith(f"{len(final.chunks)} forwards: ")

    # A regenerate's re-check: what it restored, from where, while it runs.
    shown.clear()
    ops.regenerate(w.chat, fresh=False)
    wait_idle(qtbot, w)
    again = watch(w).finished.result.report
    restored = [s for s in shown if "· regenerated · in progress: " in s["title"] and s["source"] == "memory"]
    assert restored and restored[0]["restored"] == panel.value("restored") == restored_of(again)
