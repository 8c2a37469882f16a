"""What the window says before and during a reply, through the real window (pytest-qt,
offscreen, tiny real model): the context meter counts the draft as it is typed (on the engine
thread, debounced) against the limit in force and warns before Send; prefill progress has a
rate and a time left; safe export names; a receipt is not imported as a conversation; drafts
belong to their conversation; an empty search says so."""

from __future__ import annotations

import re
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from app.core import ops  # noqa: E402
from tests.app_helpers import watch  # noqa: E402
from app.qt.window import MainWindow  # noqa: E402
from engine.engine import Engine  # noqa: E402
from tests.test_app_window import LONG, LONG_PROMPT, open_window, replies, send  # noqa: E402,F401 (a fixture)

pytestmark = pytest.mark.gui


def prompt_tokens(w: MainWindow, messages: list[dict[str, str]]) -> int:
    """The engine's own count of a prompt (on its thread), to compare the meter with."""
    return len(w.chat.executor.submit(lambda e: e.prompt_ids(messages)).result(timeout=LONG / 1000))


def path_messages(w: MainWindow) -> list[dict[str, str]]:
    return [{"role": vm.role, "content": vm.content} for vm in w.chat.vms]


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


def test_the_meter_counts_the_draft_as_typed_off_the_gui_thread_against_the_conversation_limit(
    qtbot: Any, open_window: Callable[..., MainWindow], measured: list[tuple[str, list[dict[str, str]]]]
) -> None:
    w = open_window(max_tokens=24)
    send(qtbot, w, "Why is the sky blue?")
    history = path_messages(w)
    n = prompt_tokens(w, history)
    label = w.context_meter.label
    qtbot.waitUntil(lambda: label.text() == f"{n:,} / 4,096", timeout=LONG)  # the model's own context
    w.apply_settings(replace(w.current_settings(), context_length=2048))  # this conversation's limit
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
    w.apply_settings(replace(w.current_settings(), context_length=limit, context_policy="truncate"))
    warning, label = w.context_meter.warning, w.context_meter.label
    short = prompt_tokens(w, history + [{"role": "user", "content": "short"}])
    qtbot.keyClicks(w.composer, "short")
    qtbot.waitUntil(lambda: label.text() == f"{short:,} / {limit:,}", timeout=LONG)
    assert not warning.isVisibleTo(w)
    w.composer.setPlainText("Now a longer question about the sea and the evening sky, and the sunset colours too.")
    qtbot.waitUntil(lambda: warning.isVisibleTo(w), timeout=LONG)
    assert warning.text().startswith("Will not fit: ") and f"the {limit:,}-token context" in warning.text()
    assert warning.text().endswith("Send will leave the oldest turns out of the prompt.")
    w.apply_settings(replace(w.current_settings(), context_policy="refuse"))
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
    w.apply_settings(replace(w.current_settings(), context_length=200))
    for i in range(4):
        send(qtbot, w, f"{i}: tell me more about the colours of the evening sky over the sea, please.")
    assert replies(w)[-1].report.context.dropped_messages > 0
    n = prompt_tokens(w, path_messages(w))
    assert n > 200
    qtbot.waitUntil(lambda: w.context_meter.label.text() == f"{n:,} / 200", timeout=LONG)
    assert w.context_meter.bar.value() == 1000 and not w.context_meter.budget.fits


def test_prefill_progress_shows_the_rate_and_the_time_left(qtbot: Any, open_window: Callable[..., MainWindow]) -> None:
    w = open_window(max_tokens=4, batch_interval=0.0, chunk=16)  # every progress event shown
    seen: list[tuple[str, str]] = []

    def look(reply_id: int, done: int, total: int) -> None:  # after the window's own subscriber
        body = w.chat_view.widget_for(reply_id).body.toPlainText()
        seen.append((w.statusBar().currentMessage(), body))

    w.chat.subscribe(ops.PREFILL, look)
    send(qtbot, w, LONG_PROMPT)
    line = re.compile(r"Reading the prompt: [\d,]+ / [\d,]+ · [\d.,]+ tok/s · about \d+ (s|min) left")
    assert any(line.fullmatch(status) and line.fullmatch(body) for status, body in seen), seen[:5]
    assert seen[0][0].startswith("Reading the prompt: 0 / ")  # no rate from a single event


def test_export_suggests_a_safe_file_name_in_the_documents_folder_then_the_last_used(
    qtbot: Any, open_window: Callable[..., MainWindow], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from app.qt import dialogs
    from engine.paths import documents_dir

    w = open_window(max_tokens=4)
    send(qtbot, w, "Why is the sky blue?")
    suggested: list[str] = []
    answer = [""]  # the user cancels

    def save_dialog(parent: Any, caption: str, name: str, filters: str) -> tuple[str, str]:
        suggested.append(name)
        return answer[0], ""

    monkeypatch.setattr(dialogs.QFileDialog, "getSaveFileName", save_dialog)
    w.export_conversation(w.conv_id)
    # In the documents folder (platformdirs), not the process's working directory.
    # (Home where there is no documents folder: Qt's dialog would open the working directory.)
    start = documents_dir() if documents_dir().is_dir() else Path.home()
    assert suggested == [str(start / "Why is the sky blue.md")]
    folder = tmp_path / "exports"
    folder.mkdir()
    answer[0] = str(folder / "sky.md")
    w.export_conversation(w.conv_id)
    assert "Why is the sky blue?" in (folder / "sky.md").read_text(encoding="utf-8")
    w.inspector.export_receipt(replies(w)[-1].id)  # the receipt dialog starts in the folder used last
    assert suggested[-1] == str(folder / f"reply-{replies(w)[-1].id}.receipt.json")


def test_importing_a_receipt_says_what_it_is_and_how_to_verify_it(
    qtbot: Any, open_window: Callable[..., MainWindow], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from app.qt import dialogs

    w = open_window(max_tokens=4)
    errors = watch(w)
    send(qtbot, w, "hello")
    path = str(tmp_path / "reply.receipt.json")
    assert w.inspector.export_receipt(replies(w)[-1].id, path) == path
    monkeypatch.setattr(dialogs, "import_path", lambda parent, settings: path)
    w.import_conversation()
    assert errors.last_error.startswith("reply.receipt.json is a receipt of one reply, not a conversation")
    assert f"python -m engine verify {path}" in errors.last_error
    assert len(w.sidebar.ids()) == 1  # nothing imported


def test_each_conversation_keeps_its_draft_and_a_new_chat_starts_empty(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    w = open_window(max_tokens=4)
    send(qtbot, w, "first chat")
    first = w.conv_id
    w.new_conversation()
    send(qtbot, w, "second chat")
    second = w.conv_id
    qtbot.keyClicks(w.composer, "draft for the second")
    w.sidebar.list.setCurrentRow(w.sidebar.ids().index(first))
    assert w.conv_id == first and w.composer.toPlainText() == ""
    qtbot.keyClicks(w.composer, "draft for the first")
    w.sidebar.list.setCurrentRow(w.sidebar.ids().index(second))
    assert w.composer.toPlainText() == "draft for the second"
    w.new_conversation()
    assert w.conv_id is None and w.composer.toPlainText() == ""
    w.sidebar.list.setCurrentRow(w.sidebar.ids().index(first))
    assert w.composer.toPlainText() == "draft for the first"
    send(qtbot, w, "draft for the first")  # sent: the draft is gone, here and after a switch
    w.sidebar.list.setCurrentRow(w.sidebar.ids().index(second))
    w.sidebar.list.setCurrentRow(w.sidebar.ids().index(first))
    assert w.composer.toPlainText() == ""


def test_an_empty_search_says_so_in_the_list(qtbot: Any, open_window: Callable[..., MainWindow]) -> None:
    w = open_window(max_tokens=4)
    send(qtbot, w, "apples and pears")
    w.sidebar.search.setText("zebras")
    empty = w.sidebar.empty
    qtbot.waitUntil(lambda: empty.isVisibleTo(w), timeout=LONG)
    assert empty.text() == "No conversations match “zebras”." and not w.sidebar.list.isVisibleTo(w)
    w.sidebar.search.clear()
    qtbot.waitUntil(lambda: w.sidebar.list.isVisibleTo(w) and not empty.isVisibleTo(w), timeout=LONG)
