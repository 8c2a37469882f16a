"""The window tells the truth about each reply (pytest-qt, offscreen, tiny real model): the footer
shows the latest run and the earlier ones are a click away, the reply Regenerate acts on is
marked, and what Regenerate and New variant use is said where the user looks."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtCore import QPoint, Qt  # noqa: E402

from app.core.view_models import format_seconds  # noqa: E402
from app.qt.window import MainWindow  # noqa: E402
from tests.app_helpers import watch  # noqa: E402
from tests.test_app_window import open_window, replies, send, wait_idle  # noqa: E402,F401 (a fixture)

pytestmark = pytest.mark.gui
CTRL = Qt.KeyboardModifier.ControlModifier


def selected(w: MainWindow) -> list[int]:
    """The replies drawn as selected (the assistantMessage widgets' `selected` property)."""
    return [m.vm.id for m in w.chat_view.message_widgets() if m.property("selected") is True]


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
    conv = w.conv_id
    w.new_conversation()
    w.show_conversation(conv)
    assert selected(w) == [second.id] and w.chat.selected.id == second.id
    # A click anywhere on a reply (here its text) selects it; the debug panel follows.
    w.debug_panel.show()
    assert w.debug_panel.reply_id == second.id
    body = w.chat_view.widget_for(first.id).body
    qtbot.mouseClick(body.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(5, 5))
    assert selected(w) == [first.id] and w.debug_panel.reply_id == first.id
    # Ctrl+R regenerates that reply (identical: it stays, and so do the turns after it).
    qtbot.keyClick(w, Qt.Key.Key_R, CTRL)
    wait_idle(qtbot, w)
    done = watch(w).finished.pending
    assert done.previous_id == first.id and done.duplicate_of == first.id
    assert [vm.id for vm in replies(w)] == [first.id, second.id] and selected(w) == [first.id]
    # A click on a user message leaves the selection alone.
    user = w.chat_view.widget_for(w.chat.vms[0].id)
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
    assert "regenerate" not in w.settings_summary.text()  # same settings: nothing to explain
    # Settings -> fast: the bar says what a send / new variant uses and that Regenerate stays exact.
    w.apply_settings(replace(w.current_settings(), mode="fast"))
    bar = w.settings_summary.text()
    assert bar.startswith("new: fast") and "regenerate: exact, as the reply" in bar
    assert "New variant (Ctrl+Shift+R) uses the current settings" in w.settings_summary.toolTip()
    qtbot.keyClick(w, Qt.Key.Key_R, CTRL)
    wait_idle(qtbot, w)
    assert watch(w).finished.result.report.mode == "exact"
