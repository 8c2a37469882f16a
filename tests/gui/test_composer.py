"""The message being written, in the real window (pytest-qt, offscreen, the tiny real model): the
context meter counts the draft as it is typed (off the GUI thread) against the limit in force and
warns before Send with advice that can work; a send it refuses is disabled and never touches the
conversation; each conversation keeps its draft, also across a restart."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import pytest
from PySide6.QtCore import Qt

from app.qt.window.window import MainWindow
from engine.engine import Engine
from tests.gui.driver import LONG, LONG_PROMPT, TURN, replies, send, wait_idle, watch

pytestmark = pytest.mark.gui



def path_messages(w: MainWindow) -> list[dict[str, str]]:
    return [{"role": vm.role, "content": vm.content} for vm in w.chat.conversation.vms]


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[dict[str, str]]]]:
    """Every Engine.measure call: (the thread it ran on, the messages it counted). The real
    method runs; this only watches."""
    calls: list[tuple[str, list[dict[str, str]]]] = []
    real = Engine.measure

    def watch(self: Engine, request: Any) -> Any:
        calls.append((threading.current_thread().name, list(request.messages)))
        return real(self, request)

    monkeypatch.setattr(Engine, "measure", watch)
    return calls


def prompt_tokens(w: MainWindow, messages: list[dict[str, str]]) -> int:
    """The engine's own count of a prompt (on its thread), to compare the meter with."""
    return len(w.chat.jobs.executor.submit(lambda e: e.prompt_ids(messages)).result(timeout=LONG / 1000))


def path_of(w: MainWindow) -> list[tuple[int, str, str]]:
    return [(vm.id, vm.role, vm.content) for vm in w.chat.conversation.vms]


def test_the_meter_counts_the_draft_as_typed_off_the_gui_thread_against_the_conversation_limit(
    qtbot: Any, open_window: Callable[..., MainWindow], measured: list[tuple[str, list[dict[str, str]]]]
) -> None:
    w = open_window(max_tokens=24)
    send(qtbot, w, "Why is the sky blue?")
    history = path_messages(w)
    n = prompt_tokens(w, history)
    label = w.context_meter.label
    qtbot.waitUntil(lambda: label.text() == f"{n:,} / 4,096", timeout=LONG)  # the model's own context
    w.settings.apply(replace(w.chat.conversation.settings(), context_length=2048))  # this conversation's limit
    qtbot.waitUntil(lambda: label.text() == f"{n:,} / 2,048", timeout=LONG)
    measured.clear()
    draft = "And why are sunsets red?"
    qtbot.keyClicks(w.composer, draft)
    with_draft = prompt_tokens(w, history + [{"role": "user", "content": draft}])
    qtbot.waitUntil(lambda: label.text() == f"{with_draft:,} / 2,048", timeout=LONG)
    assert with_draft > n
    # Debounced: the keys typed in one go were counted once, as a whole (the draft, then the
    # draft alone for the warning), never a partial draft; on the engine thread, not the GUI's.
    drafts = [m[-1]["content"] for _, m in measured if m[-1]["role"] == "user"]  # without one: the reply last
    assert drafts == [draft, draft], drafts
    gui = threading.current_thread().name
    assert all(t.startswith("verbatim-engine") and t != gui for t, _ in measured), measured
    assert not w.context_meter.warning.isVisibleTo(w)  # it fits
    w.composer.clear()
    qtbot.waitUntil(lambda: label.text() == f"{n:,} / 2,048", timeout=LONG)


def test_the_meter_warns_before_send_with_what_will_happen(qtbot: Any, open_window: Callable[..., MainWindow]) -> None:
    w = open_window(max_tokens=24, temperature=0.0)
    for i in range(3):
        send(qtbot, w, f"{i}: tell me about the colours of the evening sky over the sea, please.")
    history = path_messages(w)
    n = prompt_tokens(w, history)
    limit = n + 40  # the conversation fits, with room for a short message and its reply
    w.settings.apply(replace(w.chat.conversation.settings(), context_length=limit, context_policy="truncate"))
    warning, label = w.context_meter.warning, w.context_meter.label
    short = prompt_tokens(w, history + [{"role": "user", "content": "short"}])
    qtbot.keyClicks(w.composer, "short")
    qtbot.waitUntil(lambda: label.text() == f"{short:,} / {limit:,}", timeout=LONG)
    assert not warning.isVisibleTo(w)
    w.composer.setPlainText("Now a longer question about the sea and the evening sky, and the sunset colours too.")
    qtbot.waitUntil(lambda: warning.isVisibleTo(w), timeout=LONG)
    assert warning.text().startswith("Will not fit: ") and f"the {limit:,}-token context" in warning.text()
    assert warning.text().endswith("Send will leave the oldest turns out of the prompt.")
    w.settings.apply(replace(w.chat.conversation.settings(), context_policy="refuse"))
    qtbot.waitUntil(lambda: "Send will be refused" in warning.text(), timeout=LONG)
    w.composer.setPlainText(LONG_PROMPT)  # ~1000 tokens: more than the whole limit on its own
    qtbot.waitUntil(lambda: warning.text().startswith("Too long: this message alone needs"), timeout=LONG)
    w.composer.clear()  # no draft: nothing to warn about
    qtbot.waitUntil(lambda: not warning.isVisibleTo(w), timeout=LONG)


def test_after_old_turns_were_left_out_the_meter_counts_the_whole_conversation(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    """The prompt sent was cut to fit; the meter shows what the next one holds (the whole path),
    not the cut prompt (it read '76 / 2,048' for a 13,473-token conversation)."""
    w = open_window(max_tokens=8, temperature=0.0)
    w.settings.apply(replace(w.chat.conversation.settings(), context_length=200))
    for i in range(4):
        send(qtbot, w, f"{i}: tell me more about the colours of the evening sky over the sea, please.")
    assert replies(w)[-1].report.context.dropped_messages > 0
    n = prompt_tokens(w, path_messages(w))
    assert n > 200
    qtbot.waitUntil(lambda: w.context_meter.label.text() == f"{n:,} / 200", timeout=LONG)
    assert w.context_meter.bar.value() == 1000 and not w.context_meter.budget.fits


def test_too_long_advice_only_suggests_lowering_max_tokens_when_that_would_fit(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    from dataclasses import replace

    from tests.gui.driver import LONG_PROMPT

    w = open_window(max_tokens=200, temperature=0.0)
    warning = w.context_meter.warning
    w.settings.apply(replace(w.chat.conversation.settings(), context_length=512))
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
    w.settings.apply(replace(w.chat.conversation.settings(), sampler=replace(w.chat.conversation.settings().sampler, max_tokens=512 - alone)))
    qtbot.waitUntil(lambda: not warning.isVisibleTo(w), timeout=LONG)  # and then it fits


def test_the_meter_is_red_only_when_send_would_be_refused(qtbot: Any) -> None:
    from app.core.composer.context_budget import ContextBudget
    from app.qt.composer.context_meter import ContextMeter

    meter = ContextMeter()
    qtbot.addWidget(meter)
    meter.show_budget(ContextBudget(456, 430, 8, "truncate", 20))  # old turns left out: the send fits
    assert meter.property("full") is False and "leave the oldest turns out" in meter.warning.text()
    meter.show_budget(ContextBudget(456, 430, 8, "refuse", 20))
    assert meter.property("full") is True and "Send will be refused" in meter.warning.text()


# -- 4. a draft too long for the context --------------------------------------------------------
def test_a_send_the_meter_refuses_is_disabled_and_never_touches_the_conversation(
    qtbot: Any, open_window: Callable[..., MainWindow]  # noqa: F811
) -> None:
    w = open_window(max_tokens=8, temperature=0.0)
    send(qtbot, w, "Hello there.")
    limit = 120  # this conversation's own limit; the model's is larger
    w.settings.apply(replace(w.chat.conversation.settings(), context_length=limit), as_default=False)
    before = path_of(w)
    draft = TURN * 3  # ~150 tokens alone: no turn left out can make room
    w.composer.setPlainText(draft)
    qtbot.waitUntil(lambda: "Send will be refused" in w.context_meter.warning.text(), timeout=LONG)
    assert not w.reply_bar.send_button.isEnabled()
    assert w.reply_bar.send_button.toolTip() == w.context_meter.warning.text()
    qtbot.keyClick(w.composer, Qt.Key.Key_Return)  # Enter: refused as the button is
    assert not w.chat.generation.busy and path_of(w) == before and w.composer.toPlainText() == draft
    # Typed and sent before the meter counted it: the engine refuses, the send is taken back.
    again = draft + " And the stars?"
    w.composer.setPlainText(again)
    assert w.reply_bar.send_button.isEnabled()  # not counted yet: the meter does not know
    qtbot.mouseClick(w.reply_bar.send_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: bool(watch(w).errors), timeout=LONG)
    wait_idle(qtbot, w)
    assert path_of(w) == before and w.composer.toPlainText() == again
    title, text = watch(w).errors[-1]
    assert title == "Not sent" and f"this conversation's {limit:,}-token context limit" in text
    model = w.chat.link.info.context_length
    assert f"the model's own is {model:,}" in text and "model's context is" not in text


def test_a_refused_first_message_makes_no_conversation(
    qtbot: Any, open_window: Callable[..., MainWindow]  # noqa: F811
) -> None:
    w = open_window(max_tokens=8, temperature=0.0, context_length=100)  # the model's own context
    send(qtbot, w, "Hello there.")
    w.conversations.new()
    chats = w.sidebar.list.count()
    w.composer.setPlainText(TURN * 3)
    qtbot.mouseClick(w.reply_bar.send_button, Qt.MouseButton.LeftButton)  # before the count: the engine refuses
    qtbot.waitUntil(lambda: bool(watch(w).errors), timeout=LONG)
    wait_idle(qtbot, w)
    assert w.chat.conversation.conv_id is None and w.chat.conversation.vms == [] and w.sidebar.list.count() == chats
    assert len(w.session.store.list_conversations()) == chats
    assert w.composer.toPlainText() == TURN * 3
    assert "the model's 100-token context" in watch(w).errors[-1][1]


def test_each_conversation_keeps_its_draft_and_a_new_chat_starts_empty(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    w = open_window(max_tokens=4)
    send(qtbot, w, "first chat")
    first = w.chat.conversation.conv_id
    w.conversations.new()
    send(qtbot, w, "second chat")
    second = w.chat.conversation.conv_id
    qtbot.keyClicks(w.composer, "draft for the second")
    w.sidebar.list.setCurrentRow(w.sidebar.ids().index(first))
    assert w.chat.conversation.conv_id == first and w.composer.toPlainText() == ""
    qtbot.keyClicks(w.composer, "draft for the first")
    w.sidebar.list.setCurrentRow(w.sidebar.ids().index(second))
    assert w.composer.toPlainText() == "draft for the second"
    w.conversations.new()
    assert w.chat.conversation.conv_id is None and w.composer.toPlainText() == ""
    w.sidebar.list.setCurrentRow(w.sidebar.ids().index(first))
    assert w.composer.toPlainText() == "draft for the first"
    send(qtbot, w, "draft for the first")  # sent: the draft is gone, here and after a switch
    w.sidebar.list.setCurrentRow(w.sidebar.ids().index(second))
    w.sidebar.list.setCurrentRow(w.sidebar.ids().index(first))
    assert w.composer.toPlainText() == ""


# -- 5. drafts survive quitting ----------------------------------------------------------------
def test_drafts_are_stored_with_their_conversation_and_restored_at_start(
    qtbot: Any, open_window: Callable[..., MainWindow], tmp_path: Path  # noqa: F811
) -> None:
    data = tmp_path / "data"
    w = open_window(data_dir=data, max_tokens=4)
    send(qtbot, w, "first chat")
    first = w.chat.conversation.conv_id
    w.conversations.new()
    send(qtbot, w, "second chat")
    second = w.chat.conversation.conv_id
    qtbot.keyClicks(w.composer, "a draft for the second")
    w.sidebar.list.setCurrentRow(w.sidebar.ids().index(first))
    qtbot.keyClicks(w.composer, "a draft for the first")
    w.close()  # right away: the draft being typed is saved at close
    again = open_window(data_dir=data, max_tokens=4)
    assert again.chat.conversation.conv_id == second and again.composer.toPlainText() == "a draft for the second"
    again.sidebar.list.setCurrentRow(again.sidebar.ids().index(first))
    assert again.composer.toPlainText() == "a draft for the first"
    send(qtbot, again, "sent now")  # sent: no longer a draft, after a restart either
    again.close()
    third = open_window(data_dir=data, max_tokens=4)
    assert third.chat.conversation.conv_id == first and third.composer.toPlainText() == ""
    third.sidebar.list.setCurrentRow(third.sidebar.ids().index(second))
    assert third.composer.toPlainText() == "a draft for the second"


# -- issue 50, item 6: the meter shows this conversation's numbers, never another's -----------------
def test_the_meter_never_shows_another_conversations_count_nor_the_old_branchs_during_an_edit(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    w = open_window(max_tokens=24)
    label, meter = w.context_meter.label, w.context_meter

    def shown() -> bool:
        """The meter shows the count of the path in view, as it is now."""
        path = (w.chat.conversation.conv_id, tuple(vm.id for vm in w.chat.conversation.vms))
        budget = w.chat.composer.budget
        return budget is not None and w.chat.composer.budget_path == path and label.text() == budget.text

    send(qtbot, w, TURN * 2)  # a longer conversation
    long_conv = w.chat.conversation.conv_id
    qtbot.waitUntil(shown, timeout=LONG)
    long_count = label.text()
    w.conversations.new()
    send(qtbot, w, "Hi.")
    qtbot.waitUntil(shown, timeout=LONG)
    short_count = label.text()
    assert short_count != long_count
    # Opening another conversation: the previous one's numbers go at once; this one's come when counted.
    w.conversations.show(long_conv)
    assert label.text() == "…" and meter.bar.value() == 0 and "counting" in meter.toolTip()
    qtbot.waitUntil(lambda: label.text() == long_count, timeout=LONG)
    # An edit's reply: the old branch's count is not shown while the new branch is answered.
    (user,) = [vm for vm in w.chat.conversation.vms if vm.role == "user"]
    w.chat_view.editSubmitted.emit(user.id, "Hi again.")
    assert w.chat.generation.busy and label.text() == "…" and not meter.warning.isVisible()
    wait_idle(qtbot, w)
    qtbot.waitUntil(shown, timeout=LONG)
    assert label.text() != long_count
    # A reply that grows the path keeps the count in view until the new one comes (same conversation).
    before = label.text()
    send(qtbot, w, "More?", wait=False)
    assert label.text() == before
    wait_idle(qtbot, w)
