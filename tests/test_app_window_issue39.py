"""Issue 39, through the real window (pytest-qt, offscreen, tiny real model): one meaning of
"restored X / Y" everywhere; no runs button where there are no runs; search marks its hit in
the open conversation; advice that can work; explanations that stay; and the smaller items."""

from __future__ import annotations

import re
from typing import Any, Callable

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtWidgets import QLabel  # noqa: E402

from app.qt.window import MainWindow  # noqa: E402
from tests.test_app_window import LONG, open_window, replies, send  # noqa: E402,F401 (a fixture)

pytestmark = pytest.mark.gui


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
    assert f"restored {shown}" in w.statusBar().currentMessage()
    w.debug_panel.show()
    w.chat.select(reply.id)
    assert w.debug_panel.value("restored") == shown  # the same numbers, the same meaning
    keys = [label.text() for label in w.debug_panel.findChildren(QLabel, "debugKey")]
    assert "Restored" in keys and "Snapshot length" in keys and "Restored / stored" not in keys
    assert w.debug_panel.value("snapshot_length") == str(r.stored)


def test_no_runs_button_where_there_are_no_runs(qtbot: Any, open_window: Callable[..., MainWindow]) -> None:
    from app.core import ops

    w = open_window()
    send(qtbot, w, "Why is the sky blue?", wait=False)
    qtbot.waitUntil(lambda: w.chat.pending is not None, timeout=LONG)
    streaming = w.chat_view.widget_for(w.chat.pending.reply_id)
    assert not streaming.runs_button.isVisibleTo(streaming)  # a reply while it streams: no runs yet
    qtbot.waitUntil(lambda: not w.chat.generating, timeout=LONG)
    user = w.chat_view.widget_for(next(vm.id for vm in w.chat.vms if vm.role == "user"))
    assert not user.runs_button.isVisibleTo(user)  # a user message never has runs
    # The footer row adds no height: the message is its role line and body (and margins) only.
    m = user.layout().contentsMargins()
    head = user.edit_button.sizeHint().height()
    assert user.sizeHint().height() <= m.top() + head + user.layout().spacing() + user.body.height() + m.bottom() + 2
    reply = replies(w)[-1]
    ops.regenerate(w.chat, fresh=False)  # the same tokens: a second run of the same reply
    qtbot.waitUntil(lambda: not w.chat.generating, timeout=LONG)
    widget = w.chat_view.widget_for(reply.id)
    assert widget.runs_button.isVisibleTo(widget) and widget.runs_button.text() == "2 runs"


def test_a_search_hit_in_the_open_conversation_is_scrolled_to_and_marked_until_the_next_action(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    from PySide6.QtCore import QPoint, QRect, Qt

    from app.qt.widgets.sidebar import MARKED_ROLE

    w = open_window(max_tokens=4)
    w.resize(900, 500)
    send(qtbot, w, "Which rivers cross Vienna? The Danube does.")
    for i in range(6):
        send(qtbot, w, f"filler message {i} " + "words " * 40)
    hit_id = w.chat.vms[0].id
    bar, vp = w.chat_view.verticalScrollBar(), w.chat_view.viewport()
    qtbot.waitUntil(lambda: bar.value() == bar.maximum() > 0, timeout=LONG)  # at the bottom
    w.sidebar.search.setText("danube")
    qtbot.waitUntil(lambda: w.sidebar.list.count() == 1 and bool(w.sidebar.list.item(0).data(MARKED_ROLE)), timeout=LONG)
    item = w.sidebar.list.item(0)
    assert w.sidebar.list.currentItem() is item  # the open conversation: already current
    # The snippet marks the word found (as typed in any case).
    assert "<span style='background-color:#ffd84d;color:#000000'>Danube</span>" in item.data(MARKED_ROLE)
    rect = w.sidebar.list.visualItemRect(item)
    qtbot.mouseClick(w.sidebar.list.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    target = w.chat_view.widget_for(hit_id)
    assert target is not None and target.property("flash") is True
    assert target.body.marked() == ["Danube"]  # the word marked in the message
    qtbot.waitUntil(lambda: w.chat_view.following is None, timeout=LONG)
    assert vp.rect().intersects(QRect(target.mapTo(vp, QPoint(0, 0)), target.size()))  # scrolled to it
    assert bar.value() < bar.maximum()
    assert target.property("flash") is True and target.body.marked() == ["Danube"]  # no 2-second flash
    w.composer.setPlainText("next")  # the next action: the marks go
    assert target.property("flash") is False and target.body.marked() == []


def test_a_selected_search_result_is_drawn_readably_on_the_selection(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    """The style sheet gives a selected row a pale background and the text colour; the search
    result's rich text must follow it, not the palette's highlighted text (white). Its title
    (the first line, where the word found is not: the mark draws its own black on yellow) is
    what is measured."""
    from app.qt.widgets.sidebar import MARKED_ROLE

    w = open_window(max_tokens=4)
    send(qtbot, w, "Which rivers cross Vienna? " + "It is a city on a river in Europe. " * 6 + "The Danube does.")
    w.sidebar.search.setText("danube")
    qtbot.waitUntil(lambda: w.sidebar.list.count() == 1 and bool(w.sidebar.list.item(0).data(MARKED_ROLE)), timeout=LONG)
    item = w.sidebar.list.item(0)
    assert w.sidebar.list.currentItem() is item and item.isSelected()
    assert "Danube" not in item.data(MARKED_ROLE).split("<br>")[0]  # the title holds no mark
    rect = w.sidebar.list.visualItemRect(item)
    line = w.sidebar.list.fontMetrics().height()
    image = w.sidebar.list.viewport().grab().toImage()
    pixels = [image.pixelColor(x, y) for x in range(rect.left() + 3, rect.right() - 3)
              for y in range(rect.top() + 3, rect.top() + 2 + line)]
    lightness = [c.lightness() for c in pixels]
    face, darkest = max(set(lightness), key=lightness.count), min(lightness)
    assert face > 180 and darkest < 90, (face, darkest)  # dark text on the pale selection


def test_too_long_advice_only_suggests_lowering_max_tokens_when_that_would_fit(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    from dataclasses import replace

    from tests.test_app_window import LONG_PROMPT
    from tests.test_app_window_ui import prompt_tokens

    w = open_window(max_tokens=200, temperature=0.0)
    warning = w.context_meter.warning
    w.apply_settings(replace(w.current_settings(), context_length=512))
    w.composer.setPlainText(LONG_PROMPT)  # ~1000 tokens: more than the whole context on its own
    qtbot.waitUntil(lambda: warning.text().startswith("Too long: this message alone needs"), timeout=LONG)
    assert "max tokens" not in warning.text().split("Send will be refused:")[1]  # it cannot help
    assert "shorten the message" in warning.text() and "longer context" in warning.text()
    # A message that fits with a shorter reply: lowering max tokens is the advice, to a number that fits.
    text = "Why is the sky blue? Because of Rayleigh scattering of sunlight. " * 20
    alone = prompt_tokens(w, [{"role": "user", "content": text}])
    assert alone < 512 < alone + 200
    w.composer.setPlainText(text)
    qtbot.waitUntil(lambda: f"lower max tokens in Settings to {512 - alone:,} or less" in warning.text(), timeout=LONG)
    w.apply_settings(replace(w.current_settings(), sampler=replace(w.current_settings().sampler, max_tokens=512 - alone)))
    qtbot.waitUntil(lambda: not warning.isVisibleTo(w), timeout=LONG)  # and then it fits
