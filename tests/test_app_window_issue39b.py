"""Issue 39, through the real window (pytest-qt, tiny real model), items 6 and 8: no
explanation lives only in the status bar, and the smaller ones (a Regenerate on each reply,
disabled buttons drawn disabled, stale server errors cleared, one model label, a restore of 0
that says why, a prefill rate or its reason, the runs pick remembered, the system prompt the
model gets). Layout checks run under xcb too: tests/xcb_window_checks.py imports them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from app.core import ops  # noqa: E402
from app.qt.window import MainWindow  # noqa: E402
from tests.test_app_window import LONG, open_window, replies, send, wait_idle  # noqa: E402,F401 (a fixture)

pytestmark = pytest.mark.gui


def _whole(label: Any) -> bool:
    """The label shows all of its text: wrapped, and as tall as its text at its width, inside the window."""
    return label.wordWrap() and label.height() >= label.needed_height(label.width()) and label.isVisibleTo(label.window())


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
    w.chat.select(first.id)
    ops.regenerate(w.chat, fresh=True)  # a new variant of the first reply: the later turns stay behind
    wait_idle(qtbot, w)
    said = "The 4 later messages stay with the previous variant (‹ › on the reply shows them again)."
    notice = w.notice.label
    qtbot.waitUntil(lambda: notice.text() == said and _whole(notice), timeout=LONG)
    assert w.notice.geometry().right() <= w.notice.parentWidget().width()  # inside the composer area
    assert notice.width() < notice.fontMetrics().horizontalAdvance(said) * 2  # at this width, not a huge box
    send(qtbot, w, "four")  # the next reply: the explanation is over
    assert not w.notice.isVisibleTo(w) and w.notice.text() == ""


def test_a_send_the_unreachable_server_stopped_says_why_whole_and_the_stale_cold_run_error_goes(
    qtbot: Any, open_window: Callable[..., MainWindow], tiny_model: Path, tmp_path: Path
) -> None:
    from tests.cluster import running
    from tests.test_app_remote import SERVER, connect

    w = open_window(max_tokens=4)
    w.resize(1200, 800)
    w.debug_panel.show()
    w.chat.link_interval = 0.2  # probe often: the test waits on what the window shows
    with running(str(tiny_model), 1, tmp_path) as server:
        connect(qtbot, w, server.url)
        qtbot.waitUntil(lambda: w.chat.link is not None and w.chat.model_ready, timeout=SERVER)
        send(qtbot, w, "Why is the sky blue?")
        qtbot.waitUntil(lambda: not w.chat.generating, timeout=SERVER)
        reply = replies(w)[-1]
        server.stop()
        server.wait_exit()
        qtbot.waitUntil(lambda: w.chat.link is not None and not w.chat.link.up, timeout=SERVER)
        # 8d: a Verify while it is away fails, and says so in the debug panel ...
        w.chat.select(reply.id)
        w.debug_panel.verify_button.click()
        qtbot.waitUntil(lambda: w.debug_panel.value("verify").startswith("failed: "), timeout=SERVER)
        # 6: Enter on a draft: not sent, and why, whole, where it stays (the status bar elides it).
        w.composer.setPlainText("typed while the server is away")
        w.send()
        notice = w.notice.label
        qtbot.waitUntil(lambda: notice.text().startswith("Not sent: ") and _whole(notice), timeout=LONG)
        assert w.chat.link.error in notice.text() and "What you typed is kept." in notice.text()
        server.start(same_port=True)
        qtbot.waitUntil(lambda: w.chat.link is not None and w.chat.link.up, timeout=SERVER)
        # ... and once the server answers again, neither stale explanation is left in view.
        assert w.debug_panel.value("verify") == "–"
        assert not w.notice.isVisibleTo(w)


# -- 8j. a Regenerate on each reply -----------------------------------------------------------------
def test_each_reply_has_its_own_regenerate_that_regenerates_that_reply(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    from PySide6.QtCore import Qt

    w = open_window(max_tokens=4)
    send(qtbot, w, "one")
    first = replies(w)[-1]
    send(qtbot, w, "two")
    assert w.chat.selected.id != first.id  # the last reply is the one the button under the chat acts on
    started: list[Any] = []
    w.chat.subscribe(ops.PENDING, lambda p: p is not None and started.append((p.action, p.previous_id)))
    user = w.chat_view.widget_for(w.chat.vms[0].id)
    assert not user.regen_button.isVisibleTo(user)  # a user message has Edit instead
    widget = w.chat_view.widget_for(first.id)
    assert widget.regen_button.isVisibleTo(widget) and widget.regen_button.text() == "↻"
    qtbot.mouseClick(widget.regen_button, Qt.MouseButton.LeftButton)
    assert started == [("regenerate", first.id)]  # that reply, not the last one
    wait_idle(qtbot, w)
    widget = w.chat_view.widget_for(first.id)
    assert widget.runs_button.text() == "2 runs"  # its own seed and settings: the same tokens again


# -- 8i. disabled buttons drawn disabled -------------------------------------------------------------
def _ink(button: Any) -> int:
    """How far the button's text stands out from its face: the lightness range of its pixels,
    inside the border (grabbed as drawn)."""
    image = button.grab().toImage()
    inset = 4
    values = [image.pixelColor(x, y).lightness() for x in range(inset, image.width() - inset)
              for y in range(inset, image.height() - inset)]  # fmt: skip
    return max(values) - min(values)


def test_disabled_regenerate_and_new_variant_are_drawn_disabled(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    w = open_window(max_tokens=4)
    buttons = (w.regenerate_button, w.new_variant_button)
    assert not any(b.isEnabled() for b in buttons)  # an empty chat: nothing to regenerate
    disabled = [_ink(b) for b in buttons]
    send(qtbot, w, "one")
    assert all(b.isEnabled() for b in buttons)
    enabled = [_ink(b) for b in buttons]
    for off, on in zip(disabled, enabled):
        assert off < on * 0.5, (off, on)  # faint text on a flat face, not the enabled look


# -- 8c. one model label, attached to a server ---------------------------------------------------------
def test_attached_to_a_server_every_reply_has_one_model_label_and_a_regenerate_keeps_it(
    qtbot: Any, open_window: Callable[..., MainWindow], tmp_path: Path
) -> None:
    from engine.models.resolve import DEMO_NAME
    from tests.cluster import running
    from tests.test_app_remote import SERVER, connect

    w = open_window(model="demo", max_tokens=4)  # the demo, as a new user has it
    send(qtbot, w, "Why is the sky blue?")  # made here
    here = replies(w)[-1]
    assert here.model_name == DEMO_NAME
    w.chat.link_interval = 0.2
    with running("demo", 1, tmp_path) as server:  # the same model, served: its id there is "demo"
        connect(qtbot, w, server.url)
        qtbot.waitUntil(lambda: w.chat.link is not None and w.chat.model_ready, timeout=SERVER)
        send(qtbot, w, "And the sunset?", wait=False)  # made on the server
        qtbot.waitUntil(lambda: not w.chat.generating, timeout=SERVER)
        assert [vm.model_name for vm in replies(w)] == [DEMO_NAME, DEMO_NAME]
        shown: list[str] = []
        w.chat.subscribe(ops.STREAM, lambda *a: shown.append(w.chat_view.widget_for(w.chat.pending.reply_id)
                                                             .role_label.text()))
        w.chat.select(here.id)
        ops.regenerate(w.chat, fresh=False)  # the first reply, again, on the server
        shown.append(w.chat_view.widget_for(w.chat.pending.reply_id).role_label.text())
        qtbot.waitUntil(lambda: not w.chat.generating, timeout=SERVER)
        widget = w.chat_view.widget_for(w.chat.selected.id)  # the reply again (or its new variant)
        assert set(shown) == {DEMO_NAME} and widget.role_label.text() == DEMO_NAME  # the header never flips


# -- 8e. a restore of 0 with a matched prefix says why ----------------------------------------------------
def test_a_new_chat_that_matched_a_prefix_but_restored_none_says_why(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    w = open_window(max_tokens=4)
    send(qtbot, w, "Why is the sky blue?")
    w.new_conversation()
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
    reply = w.chat.selected
    r = reply.runs[-1].report
    assert r.prefill_tokens < 16 and r.restored > 0
    w.debug_panel.show()
    text = w.debug_panel.value("prefill_tps")
    assert text.startswith(f"no rate: {r.prefill_tokens} token") and f"({r.restored:,} restored)" in text
    assert text.endswith("too few (under 16) to measure prefill speed")


# -- 8h. plain English for a model imported before ---------------------------------------------------------
def test_loading_a_gguf_imported_before_says_so_in_plain_english(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    from app.core import engine_flows as flows

    w = open_window(model="demo", max_tokens=4)  # the demo is a GGUF: imported by now
    shown: list[str] = []
    w.chat.subscribe(flows.MODEL, lambda what, *a: what == "progress" and shown.append(w.model_status.text()))
    w.load_model("demo")  # again: its content was converted already
    qtbot.waitUntil(lambda: w.chat.model_ready, timeout=LONG)
    assert "imported before: using the converted copy" in shown, shown
    assert not any("already imported" in s or "100%" in s for s in shown), shown


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


# -- 8a. Export starts in Documents, never the working directory -------------------------------------------
def test_export_starts_in_documents_or_home_when_there_is_none_never_the_working_directory(
    qtbot: Any, open_window: Callable[..., MainWindow], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import platformdirs

    from app.qt import dialogs

    w = open_window(max_tokens=4)
    send(qtbot, w, "Why is the sky blue?")
    suggested: list[str] = []
    monkeypatch.setattr(dialogs.QFileDialog, "getSaveFileName",
                        lambda parent, caption, name, filters: (suggested.append(name), ("", ""))[1])
    docs = tmp_path / "Documents"
    monkeypatch.setattr(platformdirs, "user_documents_dir", lambda: str(docs))
    docs.mkdir()
    w.export_conversation(w.conv_id)
    assert Path(suggested[-1]).parent == docs  # the user's Documents (as the other dialogs)
    docs.rmdir()  # a system with no Documents folder (a fresh account, a container): Qt would open the cwd
    w.export_conversation(w.conv_id)
    assert Path(suggested[-1]).parent == Path.home() and Path(suggested[-1]).parent.is_dir()


# -- 8b. the system prompt placeholder says what the model gets -------------------------------------------
def _placeholder_shown(qtbot: Any, w: MainWindow) -> str:
    """Settings opened from the window; the system prompt field's placeholder, then closed."""
    from PySide6.QtCore import QTimer

    from app.qt.widgets.settings_dialog import SettingsDialog

    seen: list[str] = []

    def look() -> None:
        dlg = next(d for d in w.findChildren(SettingsDialog, "settingsDialog") if d.isVisible())
        seen.append(dlg.system_prompt.placeholderText())
        dlg.reject()

    QTimer.singleShot(0, look)
    w.open_settings()
    return seen[0]


@pytest.mark.parametrize("model", ["demo", "tiny"])
def test_the_system_prompt_placeholder_shows_what_the_model_gets(
    qtbot: Any, open_window: Callable[..., MainWindow], tiny_model: Path, model: str
) -> None:
    w = open_window(model="demo" if model == "demo" else str(tiny_model), max_tokens=4)
    qtbot.waitUntil(lambda: w.chat.template_system is not None, timeout=LONG)  # rendered on the engine thread
    if model == "demo":  # SmolLM2's template puts its own in when there is no system message
        assert _placeholder_shown(qtbot, w) == ("None set: the model's chat template adds its own: “You are a "
                                                "helpful AI assistant named SmolLM, trained by Hugging Face”")
    else:
        assert _placeholder_shown(qtbot, w) == "None set: the model gets no system prompt (its chat template adds none)"
