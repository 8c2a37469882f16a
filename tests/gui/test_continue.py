"""Continue in the window (pytest-qt, the tiny real model): a reply stopped, or ended at max
tokens, goes on in place; the whole reply equals the one never stopped, tokens and logprobs bit
for bit, and its badge says so and how the cache got there."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QToolButton  # noqa: E402

from app.core import ops  # noqa: E402
from app.qt.window.window import MainWindow  # noqa: E402
from tests.gui.driver import replies, send, settings, status_said, wait_idle, watch  # noqa: E402

pytestmark = pytest.mark.gui
QUESTION = "Tell me a long story about the sea."


def continue_button(w: MainWindow, reply_id: int) -> QToolButton:
    button = w.chat_view.widget_for(reply_id).findChild(QToolButton, "continueButton")
    assert button is not None
    return button


def unstopped(qtbot: Any, w: MainWindow, max_tokens: int, temperature: float) -> Any:
    """The same question in a new conversation, never stopped: the reply to compare with."""
    w.settings.apply(settings(max_tokens, temperature))
    w.conversations.new()
    send(qtbot, w, QUESTION)
    return w.session.store.get_message(replies(w)[-1].id)


def assert_badge(w: MainWindow, reply_id: int, k: int) -> None:
    """The continued reply as shown: its badge, and the report behind it (the cache restored
    the state before the reply's last token: prompt + k - 1, one token run)."""
    r = watch(w).finished.result.report
    assert r.continued_from == k and r.restored == r.prompt_tokens + k - 1 and r.prefill_tokens == 1
    badge = w.chat_view.widget_for(reply_id).identity
    assert badge.isVisible()
    assert badge.text() == (f"continued from token {k}: identical to an unstopped run "
                            f"(restored {r.restored}, 1 token run)")
    assert f"continued from token {k}" in status_said(w)
    # "restored X / Y" is of what the run held before its first new token: the prompt and the
    # reply so far (never "64 / 41", more restored than the prompt has).
    held = f"restored {r.restored} / {r.prompt_tokens + k} (prompt {r.prompt_tokens} + {k} of the reply)"
    assert held in w.chat_view.widget_for(reply_id).footer.text() and held in status_said(w)


def assert_continued(w: MainWindow, reply_id: int, reference: Any) -> None:
    reply = w.session.store.get_message(reply_id)
    assert reply.tokens == reference.tokens and reply.logprobs == reference.logprobs  # exactly
    assert reply.content == reference.content and reply.status == "complete"


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_continue_a_reply_that_ended_at_max_tokens(qtbot: Any, open_window: Callable[..., MainWindow],
                                                   temperature: float) -> None:
    w = open_window(max_tokens=8, temperature=temperature)
    send(qtbot, w, QUESTION)
    first = replies(w)[-1]
    assert w.session.store.get_message(first.id).finish_reason == "length" and first.continuable
    button = continue_button(w, first.id)
    assert button.isVisible() and "no prompt processing" in button.toolTip()
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    assert w.chat.generation.busy
    wait_idle(qtbot, w)
    assert [vm.id for vm in replies(w)] == [first.id]  # in place: the same reply, not a variant
    assert replies(w)[-1].navigator == "1 / 1"
    # As many tokens again: the reply that was asked for 16 from the start.
    assert_badge(w, first.id, 8)
    assert len(w.session.store.get_message(first.id).tokens) == 16
    assert_continued(w, first.id, unstopped(qtbot, w, 16, temperature))


def test_continue_a_stopped_reply(qtbot: Any, open_window: Callable[..., MainWindow]) -> None:
    w = open_window(max_tokens=300, temperature=0.9)
    stop_once = {"done": False}

    def stop_early(rid: int, text: str, n: int) -> None:
        if n >= 2 and not stop_once["done"]:
            stop_once["done"] = True
            ops.stop(w.chat)

    w.chat.generation.streamed.connect(stop_early)
    send(qtbot, w, QUESTION)
    first = replies(w)[-1]
    stopped = w.session.store.get_message(first.id)
    assert stopped.status == "interrupted" and 0 < len(stopped.tokens) < 300
    k = len(stopped.tokens)
    assert first.continuable and continue_button(w, first.id).isVisible()
    qtbot.mouseClick(continue_button(w, first.id), Qt.MouseButton.LeftButton)
    wait_idle(qtbot, w)
    assert_badge(w, first.id, k)
    continued = replies(w)[-1]
    reference = unstopped(qtbot, w, 300, 0.9)
    # It ends where the unstopped run ended: at max tokens, or at a token that ends a reply (a
    # random-weight model samples its end and turn tokens now and then), and says which.
    assert continued.status == "complete"
    assert continued.footer.endswith("max tokens reached") == (reference.finish_reason == "length")
    assert_continued(w, first.id, reference)


def test_continue_attached_to_a_server(qtbot: Any, open_window: Callable[..., MainWindow], tiny_model: Path) -> None:
    """The window's remote mode: the Continue goes to the server (verbatim.continue with the
    reply's ids) and comes back equal to the unstopped reply, restored there."""
    from tests.gui.driver import connect
    from tests.server_helpers import Server

    srv = Server(tiny_model, None)
    try:
        w = open_window(max_tokens=8, temperature=0.9)
        connect(qtbot, w, srv.url.removesuffix("/v1"))
        qtbot.waitUntil(lambda: w.chat.link.server is not None and w.chat.link.ready, timeout=60_000)
        w.settings.apply(settings(8, 0.9))
        send(qtbot, w, QUESTION)
        first = replies(w)[-1]
        assert first.continuable
        qtbot.mouseClick(continue_button(w, first.id), Qt.MouseButton.LeftButton)
        wait_idle(qtbot, w)
        assert_badge(w, first.id, 8)
        assert_continued(w, first.id, unstopped(qtbot, w, 16, 0.9))
    finally:
        srv.close()
