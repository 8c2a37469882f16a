"""Regenerate and New variant in the real window (pytest-qt, offscreen, the tiny real model):
a regenerate is identical and restores all but the last token, runs in the reply's own mode and
settings and says so, acts on the reply picked (each reply has its own ↻), keeps every run a
click away, and says where the later turns of a middle reply went."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from typing import Any, Callable

import pytest
from PySide6.QtCore import QPoint, Qt

from app.core import ops
from app.core.conversation.view_models import format_seconds
from app.qt.window.window import MainWindow
from tests.gui.driver import CTRL, LONG, click, replies, send, wait_idle, watch

pytestmark = pytest.mark.gui



def selected(w: MainWindow) -> list[int]:
    """The replies drawn as selected (the assistantMessage widgets' `selected` property)."""
    return [m.vm.id for m in w.chat_view.message_widgets() if m.property("selected") is True]


def _whole(label: Any) -> bool:
    """The label shows all of its text: wrapped, and as tall as its text at its width, inside the window."""
    return label.wordWrap() and label.height() >= label.needed_height(label.width()) and label.isVisibleTo(label.window())


def test_regenerate_is_identical_and_restores_all_but_last_token(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    w = open_window()
    send(qtbot, w, "Explain how a prompt cache works in two sentences.")
    first = replies(w)[-1]
    qtbot.keyClick(w, Qt.Key.Key_R, Qt.KeyboardModifier.ControlModifier)  # Ctrl/Cmd+R
    assert w.chat.generation.busy
    wait_idle(qtbot, w)
    # Identical: no copy is added; the existing reply stays selected and says so.
    second = replies(w)[-1]
    assert second.id == first.id and second.navigator == "1 / 1"
    assert watch(w).finished.result.tokens == w.session.store.get_message(first.id).tokens
    assert "identical to an existing variant" in w.statusBar().currentMessage()
    widget = w.chat_view.widget_for(second.id)
    assert "identical to an existing variant" in widget.identity.text() and widget.identity.isVisible()
    # The debug panel (Ctrl+D) shows the whole-prompt hit: restored == prompt_tokens - 1.
    qtbot.keyClick(w, Qt.Key.Key_D, Qt.KeyboardModifier.ControlModifier)
    assert w.debug_panel.isVisible()
    prompt_tokens = int(w.debug_panel.value("prompt_tokens"))
    assert w.debug_panel.value("restored") == f"{prompt_tokens - 1} / {prompt_tokens}"
    assert w.debug_panel.value("source") == "memory"
    assert "identical" in w.debug_panel.value("identity")
    assert w.debug_panel.layers.rowCount() == 4
    assert w.debug_panel.layers.item(0, 2).text() == str(prompt_tokens - 1)  # offset after restore
    assert w.debug_panel.value("chunks").startswith("1 forward")  # only the last prompt token
    qtbot.waitUntil(lambda: w.debug_panel.value("hits").startswith("1 / "), timeout=LONG)  # stats follow


def test_new_variant_changes_seed_and_navigator(qtbot: Any, open_window: Callable[..., MainWindow]) -> None:
    w = open_window()
    send(qtbot, w, "The capital of France is")
    first = replies(w)[-1]
    click(qtbot, w, "newVariantButton")
    wait_idle(qtbot, w)
    second = replies(w)[-1]
    assert second.seed != first.seed and second.navigator == "2 / 2"
    assert second.prev_id == first.id and second.next_id is None
    widget = w.chat_view.widget_for(second.id)
    assert widget.nav_label.text() == "2 / 2" and widget.prev_button.isEnabled()
    qtbot.mouseClick(widget.prev_button, Qt.MouseButton.LeftButton)
    shown = replies(w)[-1]
    assert shown.id == first.id and shown.navigator == "1 / 2" and shown.content == first.content
    qtbot.mouseClick(w.chat_view.widget_for(first.id).next_button, Qt.MouseButton.LeftButton)
    assert replies(w)[-1].id == second.id


@pytest.mark.gui
def test_window_regenerate_runs_in_the_replys_mode_after_settings_changed(qtbot: Any, open_window: Callable) -> None:
    from PySide6.QtGui import QAction

    w = open_window()  # exact mode
    send(qtbot, w, "The capital of France is")
    first = replies(w)[-1]
    assert w.session.store.get_message(first.id).cache_report["mode"] == "exact"
    w.settings.apply(dataclasses.replace(w.chat.conversation.settings(), mode="fast"))
    assert "fast" in w.reply_bar.summary.text()
    w.findChild(QAction, "debugAction").trigger()
    w.findChild(QAction, "regenerateAction").trigger()
    assert w.chat.generation.busy
    wait_idle(qtbot, w)
    assert w.debug_panel.value("mode") == "exact"  # the run's own report, shown for the reply it matched
    assert replies(w)[-1].id == first.id  # identical: no copy added
    assert "fast" in w.reply_bar.summary.text()  # the Settings stay as the user set them


def test_after_regenerate_the_footer_shows_the_latest_run_and_the_first_is_a_click_away(
    qtbot: Any, open_window: Callable[..., MainWindow]  # noqa: F811
) -> None:
    w = open_window()
    send(qtbot, w, "Explain how a prompt cache works in two sentences.")
    reply = replies(w)[-1]
    widget = w.chat_view.widget_for(reply.id)
    first = watch(w).finished.result.report
    assert f"cache: restored 0 / {first.prompt_tokens}" in widget.footer.text() and not widget.runs_button.isVisible()
    qtbot.keyClick(w, Qt.Key.Key_R, CTRL)
    wait_idle(qtbot, w)
    report = watch(w).finished.result.report
    n = report.prompt_tokens
    assert replies(w)[-1].id == reply.id and report.restored == n - 1  # identical: a run of the same reply
    widget = w.chat_view.widget_for(reply.id)
    footer = widget.footer.text()
    assert footer.startswith("run 2 of 2 · ") and f"cache: restored {n - 1} / {n} (memory)" in footer
    assert f"TTFT {format_seconds(report.ttft_s)}" in footer
    # The first run, one click away: the runs menu on the footer; picking it shows its numbers.
    assert widget.runs_button.isVisible() and widget.runs_button.text() == "2 runs"
    runs = widget.runs_button.menu().actions()
    assert [a.text()[:12] for a in runs] == ["run 1 of 2 ·", "run 2 of 2 ·"]
    assert f"cache: restored 0 / {n}" in runs[0].text() and f"TTFT {format_seconds(first.ttft_s)}" in runs[0].text()
    w.debug_panel.show()
    assert "run 2 of 2" in w.debug_panel.title.text()
    assert w.debug_panel.value("restored").startswith(f"{n - 1} / ")
    runs[0].trigger()
    assert widget.footer.text() == runs[0].text()
    assert "run 1 of 2" in w.debug_panel.title.text() and w.debug_panel.value("restored").startswith("0 / ")
    assert w.debug_panel.value("source") == "none (cold prefill)"


def test_the_reply_regenerate_acts_on_is_marked_and_a_click_on_its_text_selects_it(
    qtbot: Any, open_window: Callable[..., MainWindow]  # noqa: F811
) -> None:
    w = open_window()
    send(qtbot, w, "The capital of France is")
    first = replies(w)[-1]
    assert selected(w) == [first.id]  # a send selects the new reply
    send(qtbot, w, "And of Italy?")
    second = replies(w)[-1]
    assert selected(w) == [second.id]
    # Opened again, the conversation marks its last reply: the default.
    conv = w.chat.conversation.conv_id
    w.conversations.new()
    w.conversations.show(conv)
    assert selected(w) == [second.id] and w.chat.conversation.selected.id == second.id
    # A click anywhere on a reply (here its text) selects it; the debug panel follows.
    w.debug_panel.show()
    assert w.debug_panel.reply_id == second.id
    body = w.chat_view.widget_for(first.id).body
    qtbot.mouseClick(body.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(5, 5))
    assert selected(w) == [first.id] and w.debug_panel.reply_id == first.id
    # Ctrl+R regenerates that reply (identical: it stays, and so do the turns after it).
    qtbot.keyClick(w, Qt.Key.Key_R, CTRL)
    wait_idle(qtbot, w)
    done = watch(w).finished
    assert done.pending.previous_id == first.id and done.saved.duplicate_of == first.id
    assert [vm.id for vm in replies(w)] == [first.id, second.id] and selected(w) == [first.id]
    # A click on a user message leaves the selection alone.
    user = w.chat_view.widget_for(w.chat.conversation.vms[0].id)
    qtbot.mouseClick(user.body.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(5, 5))
    assert selected(w) == [first.id]


def test_the_window_says_regenerate_repeats_the_replys_settings(
    qtbot: Any, open_window: Callable[..., MainWindow]  # noqa: F811
) -> None:
    w = open_window()
    send(qtbot, w, "Why is the sky blue?")
    reply = replies(w)[-1]
    tip = w.chat_view.widget_for(reply.id).footer.toolTip()
    assert "Regenerate (Ctrl+R) repeats this reply's own settings" in tip and f"seed {reply.seed}" in tip
    assert "New variant (Ctrl+Shift+R) uses the current settings" in tip
    assert "regenerate" not in w.reply_bar.summary.text()  # same settings: nothing to explain
    # Settings -> fast: the bar says what a send / new variant uses and that Regenerate stays exact.
    w.settings.apply(replace(w.chat.conversation.settings(), mode="fast"))
    bar = w.reply_bar.summary.text()
    assert bar.startswith("new: fast") and "regenerate: exact, as the reply" in bar
    assert "New variant (Ctrl+Shift+R) uses the current settings" in w.reply_bar.summary.toolTip()
    qtbot.keyClick(w, Qt.Key.Key_R, CTRL)
    wait_idle(qtbot, w)
    assert watch(w).finished.result.report.mode == "exact"


# -- 8j. a Regenerate on each reply -----------------------------------------------------------------
def test_each_reply_has_its_own_regenerate_that_regenerates_that_reply(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    from PySide6.QtCore import Qt

    w = open_window(max_tokens=4)
    send(qtbot, w, "one")
    first = replies(w)[-1]
    send(qtbot, w, "two")
    assert w.chat.conversation.selected.id != first.id  # the last reply is the one the button under the chat acts on
    started: list[Any] = []
    w.chat.generation.started.connect(lambda p: started.append((p.action, p.previous_id)))
    user = w.chat_view.widget_for(w.chat.conversation.vms[0].id)
    assert not user.regen_button.isVisibleTo(user)  # a user message has Edit instead
    widget = w.chat_view.widget_for(first.id)
    assert widget.regen_button.isVisibleTo(widget) and widget.regen_button.text() == "↻"
    qtbot.mouseClick(widget.regen_button, Qt.MouseButton.LeftButton)
    assert started == [("regenerate", first.id)]  # that reply, not the last one
    wait_idle(qtbot, w)
    widget = w.chat_view.widget_for(first.id)
    assert widget.runs_button.text() == "2 runs"  # its own seed and settings: the same tokens again


# -- 6. explanations stay, whole ------------------------------------------------------------------
def test_a_branch_explained_at_1200_px_with_the_dock_open_is_shown_whole_until_the_next_reply(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    w = open_window(max_tokens=4)
    w.resize(1200, 800)
    w.debug_panel.show()
    send(qtbot, w, "one")
    first = replies(w)[-1]
    send(qtbot, w, "two")
    send(qtbot, w, "three")
    w.chat.conversation.select(first.id)
    ops.regenerate(w.chat, fresh=True)  # a new variant of the first reply: the later turns stay behind
    wait_idle(qtbot, w)
    said = "The 4 later messages stay with the previous variant (‹ › on the reply shows them again)."
    notice = w.notice.label
    qtbot.waitUntil(lambda: notice.text() == said and _whole(notice), timeout=LONG)
    assert w.notice.geometry().right() <= w.notice.parentWidget().width()  # inside the composer area
    assert notice.width() < notice.fontMetrics().horizontalAdvance(said) * 2  # at this width, not a huge box
    send(qtbot, w, "four")  # the next reply: the explanation is over
    assert not w.notice.isVisibleTo(w) and w.notice.text() == ""


def test_regenerating_a_middle_reply_says_where_the_later_turns_went(
    qtbot: Any, open_window: Callable[..., MainWindow]  # noqa: F811
) -> None:
    w = open_window(max_tokens=4)
    send(qtbot, w, "one")
    first = replies(w)[-1]
    send(qtbot, w, "two")
    send(qtbot, w, "three")
    w.chat.conversation.select(first.id)
    said: list[str] = []
    w.chat.notices.status_changed.connect(lambda text, ms: said.append(text))
    ops.regenerate(w.chat, fresh=True)  # a new variant of the first reply
    wait_idle(qtbot, w)
    assert len(w.chat.conversation.vms) == 2  # the later turns belong to the previous variant
    assert said[-1].endswith(" · the 4 later messages stay with the previous variant (‹ › on the reply shows them again)")


# -- 7. a stopped regenerate is compared as far as it got --------------------------------------
def test_a_stopped_regenerate_is_described_as_identical_as_far_as_it_got(
    qtbot: Any, open_window: Callable[..., MainWindow]  # noqa: F811
) -> None:
    w = open_window(max_tokens=2000, temperature=0.0)  # greedy: runs to the limit, never an early EOS
    send(qtbot, w, "Tell me a long story.", wait=False)
    qtbot.waitUntil(lambda: w.chat.generation.stream.tokens > 40, timeout=LONG)
    ops.stop(w.chat)  # the first reply: stopped too, but longer than the regenerate will get
    wait_idle(qtbot, w)
    first = replies(w)[-1]
    ops.regenerate(w.chat, fresh=False)
    qtbot.waitUntil(lambda: w.chat.generation.stream.tokens > 8, timeout=LONG)
    ops.stop(w.chat)
    wait_idle(qtbot, w)
    again = replies(w)[-1]
    stored = w.session.store.get_message(again.id)
    n = len(stored.tokens)
    assert again.id != first.id and stored.status == "interrupted" and 8 < n < len(w.session.store.get_message(first.id).tokens)
    w.debug_panel.show()
    identity = w.debug_panel.value("identity")
    assert identity == f"identical to previous as far as this one got ({n} tokens, bit-equal logprobs; it was stopped)"
    assert w.chat_view.widget_for(again.id).identity.text() == "✓ identical to previous as far as it got"
    w.conversations.new()  # read back from the store, the same words
    w.sidebar.list.setCurrentRow(0)
    w.chat.conversation.select(again.id)
    assert w.debug_panel.value("identity") == identity
