"""A 2,000-message conversation in the real window (pytest-qt, offscreen, tiny real model): the
chat view builds widgets only near the viewport, and every feature still works on a message far
from the bottom: scrolling to it, its variants, selecting it for Regenerate, the inspector, its
identity badge, a search hit, and the last reply streaming at the bottom."""

from __future__ import annotations

from typing import Any, Callable

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtCore import QRect, Qt  # noqa: E402

from app.qt.window.window import MainWindow  # noqa: E402
from tests.gui.driver import LONG, click, replies, send, wait_compared, wait_idle  # noqa: E402

pytestmark = pytest.mark.gui
N = 2000
BUILT_MAX = 80  # widgets a 2,000-message conversation may have after opening or a jump


def filler(i: int) -> str:
    words = " ".join(f"w{(i * 7 + k) % 97}" for k in range(8 + (i * 37) % 90))
    return f"message {i}: {words}" + ("\n\n```python\nx = 1\n```" if i % 14 == 3 else "")


def long_chat(qtbot: Any, w: MainWindow) -> tuple[int, Any, Any]:
    """A conversation whose first reply has two real variants (tokens, runs), then N - 2 stored
    messages after the second; opened afresh. Returns (conversation, first variant, second)."""
    send(qtbot, w, "Why is the sky blue?")
    first = replies(w)[-1]
    click(qtbot, w, "newVariantButton")
    wait_idle(qtbot, w)
    second = replies(w)[-1]
    conv = w.chat.conversation.conv_id
    parent = second.id
    for i in range(2, N):
        parent = w.session.store.add_message(conv, parent, "user" if i % 2 == 0 else "assistant", filler(i)).id
    w.conversations.show(None)
    w.conversations.show(conv)
    assert len(w.chat.conversation.vms) == N
    return conv, first, second


def settle(view: Any) -> None:
    """Let the layout finish (message heights follow their width over a few passes): until the
    canvas keeps its height and nothing is queued."""
    from PySide6.QtWidgets import QApplication

    seen: list[int] = []
    while len(seen) < 3 or len(set(seen[-3:])) > 1 or view._move_queued:
        QApplication.processEvents()
        seen.append(view.widget().height())
        assert len(seen) < 1000


def in_viewport(w: MainWindow, widget: Any) -> bool:
    view = w.chat_view
    top_left = widget.mapTo(view.viewport(), widget.rect().topLeft())
    return widget.isVisible() and QRect(top_left, widget.size()).intersects(view.viewport().rect())


def test_a_long_conversation_builds_only_the_messages_near_the_viewport(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    w = open_window(max_tokens=8)
    w.resize(1000, 700)
    conv, first, second = long_chat(qtbot, w)
    view = w.chat_view
    bar = view.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.value() == bar.maximum() and bar.maximum() > 0, timeout=LONG)
    assert len(view.widgets) <= BUILT_MAX and len(view.message_widgets()) <= BUILT_MAX
    last = w.chat.conversation.vms[-1]
    assert in_viewport(w, view.widgets[last.id]) and view.widgets[last.id].text() == last.content
    # The spacers stand for the rest: the canvas is about as tall as all of it.
    assert view.top_pad.height() > 50 * N

    # Drag to the middle: the window moves there, still bounded, the messages there in view.
    bar.setValue(bar.maximum() // 2)
    qtbot.waitUntil(lambda: any(in_viewport(w, x) for x in view.message_widgets()), timeout=LONG)
    settle(view)
    middle = [x for x in view.message_widgets() if in_viewport(w, x)]
    assert middle and all(x.text() == filler(int(x.vm.content.split(":")[0].split()[1]))
                          for x in middle if x.vm.content.startswith("message "))
    assert len(view.widgets) <= BUILT_MAX
    index = w.chat.conversation.vms.index(middle[0].vm)
    assert 100 < index < N - 100

    # Scroll up step by step from there: the message at the top stays put as the window moves.
    anchor = middle[0]
    y = anchor.mapTo(view.viewport(), anchor.rect().topLeft()).y()
    steps = 6  # 240 px: the anchor stays in the viewport while the window moves above it
    for _ in range(steps):
        bar.setValue(bar.value() - 40)
        qtbot.wait(0)
    settle(view)
    assert anchor.vm.id in view.widgets and in_viewport(w, anchor)
    assert anchor.mapTo(view.viewport(), anchor.rect().topLeft()).y() == y + steps * 40
    assert len(view.widgets) <= BUILT_MAX


def test_far_messages_keep_their_variants_selection_inspector_badge_and_search(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    w = open_window(max_tokens=8)
    w.resize(1000, 700)
    conv, first, second = long_chat(qtbot, w)
    view = w.chat_view
    assert second.id not in view.widgets  # far from the bottom: not built at opening

    # Scrolled into view on demand, with its variants, badge and footer.
    widget = view.widget_for(second.id)
    assert widget is not None and in_viewport(w, widget)
    assert widget.nav_label.text() == "2 / 2" and widget.prev_button.isEnabled()
    assert widget.identity.text() and widget.identity.isVisible()
    assert len(view.widgets) <= BUILT_MAX

    # The inspector: Compare the far reply with its other variant, and its tokens.
    qtbot.mouseClick(widget, Qt.MouseButton.LeftButton)  # selected: the reply the inspector acts on
    assert w.chat.conversation.selected is not None and w.chat.conversation.selected.id == second.id
    data = wait_compared(qtbot, w, widget.compare_button.click)
    assert data.a.message_id == second.id and data.b.message_id == first.id
    with qtbot.waitSignal(w.inspector.tokensShown, timeout=LONG):
        widget.tokens_button.click()
    assert widget.token_view is not None and widget.token_view.isVisible()
    assert widget.token_view.tokens == w.session.store.get_message(second.id).tokens
    widget.tokens_button.click()

    # A search hit near the top, from the bottom: revealed in view and flashed.
    view.scroll_to_bottom()
    qtbot.waitUntil(lambda: view.verticalScrollBar().value() == view.verticalScrollBar().maximum(), timeout=LONG)
    target = w.chat.conversation.vms[6]
    assert target.id not in view.widgets or not in_viewport(w, view.widgets[target.id])
    w.conversations.reveal(target.id)
    shown = view.widgets[target.id]
    qtbot.waitUntil(lambda: in_viewport(w, shown), timeout=LONG)
    assert shown.text() == target.content

    # Selecting the far reply makes it the one Regenerate acts on.
    widget = view.widget_for(second.id)
    qtbot.mouseClick(widget, Qt.MouseButton.LeftButton)
    assert w.chat.conversation.selected is not None and w.chat.conversation.selected.id == second.id
    runs_before = len(w.session.store.runs(conv).get(second.id, []))
    click(qtbot, w, "regenerateButton")
    wait_idle(qtbot, w)
    # Same seed, same prompt: the far reply again, bit for bit: a run of it, not a new variant.
    assert len(w.session.store.runs(conv)[second.id]) == runs_before + 1
    assert len(w.session.store.children(w.chat.conversation.vms[0].id)) == 2
    assert w.chat.conversation.vms[1].id == second.id and len(w.chat.conversation.vms) == N and len(view.widgets) <= BUILT_MAX

    # Its runs menu: two runs now; picking the first shows it in the footer.
    widget = view.widget_for(second.id)
    runs = widget.runs_button.menu().actions()
    assert len(runs) == runs_before + 1 and widget.runs_button.isVisible()
    runs[0].trigger()
    qtbot.waitUntil(lambda: w.chat.conversation.runs_shown.get(second.id) == 0, timeout=LONG)
    widget = view.widget_for(second.id)
    assert widget.footer.text().startswith(f"run 1 of {runs_before + 1} · ")

    # Copy on the far reply puts its text on the clipboard.
    from PySide6.QtGui import QGuiApplication

    widget.copy_button.click()
    assert QGuiApplication.clipboard().text() == widget.text() == w.session.store.get_message(second.id).content

    # Its variants from far up: the first (its path ends there), then back to the long one.
    view.widget_for(second.id).prev_button.click()
    qtbot.waitUntil(lambda: len(w.chat.conversation.vms) == 2 and w.chat.conversation.vms[1].id == first.id, timeout=LONG)
    view.widget_for(first.id).next_button.click()
    qtbot.waitUntil(lambda: len(w.chat.conversation.vms) == N, timeout=LONG)
    assert w.chat.conversation.vms[1].id == second.id and len(view.widgets) <= BUILT_MAX


def test_a_reply_streams_at_the_bottom_of_a_long_conversation(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    w = open_window(max_tokens=24)
    w.resize(1000, 700)
    long_chat(qtbot, w)
    view = w.chat_view
    bar = view.verticalScrollBar()
    send(qtbot, w, "And one more question?", wait=False)
    pending = w.chat.generation.pending
    qtbot.waitUntil(lambda: pending.reply_id in view.widgets and view.widgets[pending.reply_id].streaming,
                    timeout=LONG)
    wait_idle(qtbot, w)
    reply = view.widgets[w.chat.conversation.vms[-1].id]
    assert reply.text() == w.chat.conversation.vms[-1].content and w.chat.conversation.vms[-1].content
    qtbot.waitUntil(lambda: bar.value() == bar.maximum(), timeout=LONG)
    assert in_viewport(w, reply) and len(view.widgets) <= BUILT_MAX
