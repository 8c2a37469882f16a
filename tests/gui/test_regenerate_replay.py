"""Regenerate in the window (pytest-qt, offscreen, the tiny real model): a regenerate expected to
repeat its reply shows the reply's text at once, marked as re-checked, and confirms it token by
token as the engine recomputes it ("verified k / N"), ending in the identical badge; one that
parts from it is marked at the token where it parts, the new text shown from there on."""

from __future__ import annotations

from typing import Any, Callable

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from app.core.conversation.markdown import render  # noqa: E402
from app.core.generation.replay import REGENERATE_TIP, Replay  # noqa: E402
from app.qt.conversation.message_widget import MessageBody  # noqa: E402
from app.qt.window.window import MainWindow  # noqa: E402
from tests.gui.driver import click, replies, send, settings, wait_idle, watch  # noqa: E402

pytestmark = pytest.mark.gui
QUESTION = "Explain how a prompt cache works in two sentences."


class Seen:
    """What the reply's widget shows at each REPLAY event (read from the widget, as the user sees it)."""

    def __init__(self, w: MainWindow) -> None:
        self.w = w
        self.events: list[dict[str, Any]] = []
        self.last: Replay | None = None
        w.chat.generation.replayed.connect(self._on)

    def _on(self, reply_id: int, replay: Replay) -> None:
        widget = self.w.chat_view.widget_for(reply_id)
        self.last = replay
        self.events.append({"seen": replay.seen, "verified": replay.verified, "ended": replay.ended,
                            "body": widget.body.toPlainText(), "text": widget.text(),
                            "badge": widget.identity.text(), "state": widget.identity.property("state"),
                            "badge_shown": widget.identity.isVisible()})


def plain(text: str, w: MainWindow, streaming: bool = False) -> str:
    """`text` as a message body shows it (rendered markdown, as plain text)."""
    body = MessageBody()
    body.set_rendered(render(text, w.chat_view.palette_, streaming=streaming))
    return body.toPlainText()


def test_a_regenerate_shows_the_reply_at_once_and_verifies_it_as_it_is_recomputed(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    w = open_window(max_tokens=40)
    send(qtbot, w, QUESTION)
    first = replies(w)[-1]
    stored = w.session.store.get_message(first.id)
    n = len(stored.tokens)
    shown_before = w.chat_view.widget_for(first.id).body.toPlainText()
    assert n > 4 and shown_before.strip()
    assert w.reply_bar.regenerate_button.toolTip() == REGENERATE_TIP and "decode speed" in REGENERATE_TIP
    seen = Seen(w)
    streamed = watch(w).stream_updates
    click(qtbot, w, "regenerateButton")
    # At once, before the engine handed over a single token: the previous reply's whole text,
    # marked as being re-checked, nothing verified yet.
    assert w.chat.generation.busy and watch(w).stream_updates == streamed
    start = seen.events[0]
    assert start["seen"] == 0 and start["body"] == shown_before and start["text"] == stored.content
    assert start["badge"] == f"re-checking… verified 0 / {n}" and start["state"] == "checking" and start["badge_shown"]
    wait_idle(qtbot, w)
    # Verified as the tokens came: the count follows the engine, never ahead of it, and the text
    # shown never changed (it was the reply all along).
    verified = [e["verified"] for e in seen.events]
    assert verified == sorted(verified) and all(e["verified"] == e["seen"] for e in seen.events)
    assert all(e["badge"] == f"re-checking… verified {e['verified']} / {n}" for e in seen.events if not e["ended"])
    assert all(e["body"] == shown_before for e in seen.events)
    end = seen.events[-1]
    assert end["ended"] and end["badge"] == f"✓ verified {n} / {n}" and end["state"] == "same"
    assert [e for e in seen.events if e["ended"]] == [end]  # confirmed once, after the engine's last token
    result = watch(w).finished.result
    assert result.tokens == stored.tokens and result.logprobs == stored.logprobs
    # And it ends as a regenerate that repeats always did: the same reply, its identical badge.
    again = replies(w)[-1]
    assert again.id == first.id and again.navigator == "1 / 1"
    widget = w.chat_view.widget_for(first.id)
    assert widget.replay is None and widget.body.toPlainText() == shown_before
    assert widget.identity.isVisible() and "identical to an existing variant" in widget.identity.text()


def test_a_regenerate_that_parts_from_the_reply_is_marked_where_it_parts(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    w = open_window(max_tokens=40)
    send(qtbot, w, QUESTION)
    first = replies(w)[-1]
    stored = w.session.store.get_message(first.id)
    n = len(stored.tokens)
    # The system prompt changed since the reply: the app cannot tell before the run (the reply
    # keeps its seed and sampler, not its prompt), so it still expects a repeat; the
    # recomputation shows it is not one.
    w.settings.apply(settings(40, 0.9, system_prompt="You are a pirate. Answer as one."))
    seen = Seen(w)
    click(qtbot, w, "regenerateButton")
    assert seen.events[0]["badge"] == f"re-checking… verified 0 / {n}"
    assert seen.events[0]["text"] == stored.content
    wait_idle(qtbot, w)
    result = watch(w).finished.result
    # Where the new run first differs from the reply shown: a token, or a logprob not bit-equal.
    pairs = list(zip(stored.tokens, stored.logprobs))
    k = next((i for i, (t, lp) in enumerate(zip(result.tokens, result.logprobs)) if i >= n or pairs[i] != (t, lp)),
             min(len(result.tokens), n))
    assert result.tokens != stored.tokens or result.logprobs != stored.logprobs
    replay = seen.last
    assert replay is not None and replay.departure is not None and replay.departure.index == k
    assert replay.verified == k and not replay.confirmed
    end = seen.events[-1]
    assert end["ended"] and end["state"] == "diff"
    assert end["badge"].startswith(f"≠ parts from the previous reply at token {k} ")
    assert all(e["verified"] <= k for e in seen.events)
    # The body: the text both share, the mark, then the recomputed text from there on.
    chars = replay.departure.chars
    assert result.text[:chars] == stored.content[:chars] and end["text"] == result.text
    head, mark, tail = end["body"].partition(f"── parts here, at token {k}: the recomputed reply from here on ──")
    assert mark and tail.strip() == plain(result.text[chars:], w).strip()
    assert head.strip() == (plain(result.text[:chars], w).strip() if result.text[:chars].strip() else "")
    # Saved as a new variant with the badge a differing regenerate always had.
    new = replies(w)[-1]
    assert new.id != first.id and new.navigator == "2 / 2" and new.badge_state in ("diff", "near")
    widget = w.chat_view.widget_for(new.id)
    assert widget.replay is None and widget.identity.property("state") in ("diff", "near")
