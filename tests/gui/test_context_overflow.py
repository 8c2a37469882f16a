"""The window on a conversation longer than the model's context: the oldest turns are left out,
a marker in the chat and the debug panel say so, the meter shows how full the context is, and
regenerate stays instant and identical; the "refuse" setting refuses instead."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from app.core import ops
from app.qt.window.window import MainWindow
from tests.gui.driver import TURN, replies, send, wait_idle, watch  # noqa: E402

CONTEXT = 260


def test_oldest_turns_left_out_with_a_marker_a_meter_and_identical_regenerate(
    qtbot: Any, open_window: Callable[..., MainWindow]  # noqa: F811
) -> None:
    w = open_window(context_length=CONTEXT, max_tokens=8, temperature=0.0)
    for i in range(6):
        send(qtbot, w, f"{i}: {TURN}")
    vms = w.chat.conversation.vms
    last = replies(w)[-1]
    ctx = last.report.context
    assert ctx.limit == CONTEXT and ctx.dropped_messages >= 2 and ctx.prompt_tokens + 8 <= CONTEXT
    marker = w.chat_view.marker
    assert marker.isVisible() and marker.text().startswith(f"{ctx.dropped_messages} earlier messages are not sent")
    # the marker sits right before the first message that was sent
    layout = w.chat_view.col_layout
    first_sent = w.chat_view.widget_for(vms[ctx.dropped_messages].id)
    assert layout.indexOf(marker) + 1 == layout.indexOf(first_sent)
    # The meter counts the next prompt: the whole path (more than fits, hence the marker), not
    # the prompt that was cut to fit (tests/test_app_window_ui.py: the draft too).
    path = [{"role": vm.role, "content": vm.content} for vm in vms]
    used = len(w.chat.jobs.executor.submit(lambda e: e.prompt_ids(path)).result(timeout=60))
    qtbot.waitUntil(lambda: w.context_meter.label.text() == f"{used:,} / {CONTEXT:,}", timeout=20_000)
    assert used > CONTEXT and w.context_meter.bar.value() == 1000
    w.debug_panel.show()  # the panel fills itself when shown
    assert "left out" in w.debug_panel.value("context") and f"of {CONTEXT:,} tokens" in w.debug_panel.value("context")

    ops.regenerate(w.chat, fresh=False)
    wait_idle(qtbot, w)
    result = watch(w).finished.result  # identical: no copy is added, the reply stays
    assert replies(w)[-1].id == last.id
    assert result.report.restored == result.report.prompt_tokens - 1
    assert result.report.context.dropped_messages == ctx.dropped_messages
    old = w.session.store.get_message(last.id)
    assert (result.tokens, result.logprobs) == (old.tokens, old.logprobs)


def test_refuse_setting_shows_the_numbers_and_gives_the_message_back(
    qtbot: Any, open_window: Callable[..., MainWindow]  # noqa: F811
) -> None:
    w = open_window(context_length=CONTEXT, max_tokens=8, temperature=0.0)
    w.settings.apply(replace(w.chat.conversation.settings(), context_policy="refuse"))
    send(qtbot, w, "0: " + TURN)
    before = [(vm.id, vm.content) for vm in w.chat.conversation.vms]
    send(qtbot, w, "1: " + TURN * 3)  # ~150 more tokens: no longer fits (sent before the meter counted it)
    text = watch(w).last_error or ""
    assert text.startswith("Not sent: the prompt needs ") and f"the model's {CONTEXT}-token context" in text
    # Refused: the conversation is as it was, the message back in the composer to shorten.
    assert [(vm.id, vm.content) for vm in w.chat.conversation.vms] == before and w.composer.toPlainText() == "1: " + TURN * 3
    assert not w.chat_view.marker.isVisible()


def test_every_follow_up_in_exact_mode_restores_the_earlier_turns(
    qtbot: Any, open_window: Callable[..., MainWindow]  # noqa: F811
) -> None:
    """Chunk size 512 and short turns: only the message-boundary cuts make a follow-up warm."""
    w = open_window(chunk=512, max_tokens=8, temperature=0.0)
    assert w.chat.conversation.settings().mode == "exact"
    for i in range(4):
        send(qtbot, w, f"Question {i}: why is the sky blue?")
    footers = [w.chat_view.widget_for(vm.id).footer.text() for vm in replies(w)]
    restored = [int(f.split("cache: restored ")[1].split(" / ")[0]) for f in footers]
    assert restored[0] == 0 and all(r > 0 for r in restored[1:]), footers
    reports = [vm.report for vm in replies(w)]
    # each at the previous turn's regenerate point (a reply header cut: its prompt but the last token)
    assert all(r.restored == prev.prompt_tokens - 1 and r.restored in r.reply_header_cuts
               for prev, r in zip(reports, reports[1:]))


def test_the_context_limit_setting_applies_to_the_next_reply(
    qtbot: Any, open_window: Callable[..., MainWindow]  # noqa: F811
) -> None:
    from app.qt.conversation.settings_dialog import SettingsDialog

    w = open_window(max_tokens=8, temperature=0.0)  # no start-up override: the model's own context
    dlg = SettingsDialog(w.chat.conversation.settings(), w)
    qtbot.addWidget(dlg)
    assert dlg.context_length.value() == 0 and dlg.context_length.text() == "the model's own"
    dlg.context_length.setValue(CONTEXT)
    w.settings.apply(dlg.value())
    for i in range(4):
        send(qtbot, w, f"{i}: {TURN}")
    ctx = replies(w)[-1].report.context
    assert ctx.limit == CONTEXT and ctx.dropped_messages > 0 and w.chat_view.marker.isVisible()
