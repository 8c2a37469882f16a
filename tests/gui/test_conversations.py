"""The conversation list in the real window (pytest-qt, offscreen, the tiny real model): new,
rename, delete, search off the GUI thread (a hit scrolled to and marked until the next action,
drawn readably when selected), export with a safe name in the documents folder, import (a receipt
is named as one), and the open conversation highlighted after a restart."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import pytest
from PySide6.QtCore import Qt

from app.core.conversation import listing
from app.qt.window.window import MainWindow
from tests.gui.driver import LONG, replies, send, watch

pytestmark = pytest.mark.gui



def test_conversations_new_rename_search_delete(qtbot: Any, open_window: Callable[..., MainWindow]) -> None:
    w = open_window(max_tokens=4)
    send(qtbot, w, "apples and pears")
    first = w.chat.conversation.conv_id
    qtbot.keyClick(w, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert w.chat.conversation.conv_id is None and w.chat.conversation.vms == []
    send(qtbot, w, "bananas")
    assert w.chat.conversation.conv_id != first and w.sidebar.list.count() == 2
    w.conversations.rename(first, "Fruit salad")
    assert "Fruit salad" in [w.sidebar.list.item(i).text() for i in range(w.sidebar.list.count())]
    w.sidebar.search.setText("pears")
    qtbot.waitUntil(lambda: w.sidebar.ids() == [first], timeout=LONG)
    w.sidebar.search.clear()
    qtbot.waitUntil(lambda: len(w.sidebar.ids()) == 2, timeout=LONG)
    w.sidebar.list.setCurrentRow(w.sidebar.ids().index(first))
    assert w.chat.conversation.conv_id == first and w.chat.conversation.vms[0].content == "apples and pears"
    w.conversations.delete(first, confirm=False)
    assert w.chat.conversation.conv_id is None and len(w.sidebar.ids()) == 1


def test_search_runs_off_the_gui_thread_and_a_hit_scrolls_to_its_message(
    qtbot: Any, open_window: Callable[..., MainWindow], monkeypatch: Any
) -> None:
    import threading

    from PySide6.QtCore import QPoint, QRect

    w = open_window(max_tokens=4)
    w.resize(900, 500)
    send(qtbot, w, "Which rivers cross Vienna? The Danube does.")
    for i in range(6):
        send(qtbot, w, f"filler message {i} " + "words " * 40)
    first = w.chat.conversation.conv_id
    hit_id = w.chat.conversation.vms[0].id
    w.conversations.new()
    send(qtbot, w, "something else")
    threads: list[str] = []
    search = listing.items
    monkeypatch.setattr(listing, "items",
                        lambda session, q: (threads.append(threading.current_thread().name), search(session, q))[1])
    w.sidebar.search.setText("danube")
    qtbot.waitUntil(lambda: w.sidebar.ids() == [first], timeout=LONG)
    assert threads and threading.main_thread().name not in threads
    assert "Danube" in w.sidebar.list.item(0).text()
    w.sidebar.list.setCurrentRow(0)
    assert w.chat.conversation.conv_id == first
    target = w.chat_view.widget_for(hit_id)
    assert target.property("flash") is True
    qtbot.waitUntil(lambda: w.chat_view.following is None, timeout=LONG)  # the layout settled
    assert target.property("flash") is True  # marked until the next action
    vp = w.chat_view.viewport()  # and the hit is still in view (nothing scrolled it away)
    assert vp.rect().intersects(QRect(target.mapTo(vp, QPoint(0, 0)), target.size()))
    assert w.chat_view.verticalScrollBar().value() < w.chat_view.verticalScrollBar().maximum()


def test_a_search_hit_in_the_open_conversation_is_scrolled_to_and_marked_until_the_next_action(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    from PySide6.QtCore import QPoint, QRect, Qt

    from app.qt.conversation.sidebar import MARKED_ROLE

    w = open_window(max_tokens=4)
    w.resize(900, 500)
    send(qtbot, w, "Which rivers cross Vienna? The Danube does.")
    for i in range(6):
        send(qtbot, w, f"filler message {i} " + "words " * 40)
    hit_id = w.chat.conversation.vms[0].id
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


# -- 6. a search hit is scrolled to and highlighted ----------------------------------------------
def test_a_search_hit_in_the_middle_of_a_long_conversation_is_scrolled_to_and_highlighted(
    qtbot: Any, open_window: Callable[..., MainWindow]  # noqa: F811
) -> None:
    from PySide6.QtCore import QPoint, QRect

    w = open_window(max_tokens=4)
    w.resize(1000, 700)
    for i in range(8):
        send(qtbot, w, f"filler message {i} " + "words " * 60)
        if i == 4:
            send(qtbot, w, "Which rivers cross Vienna? The Danube does.")
    first = w.chat.conversation.conv_id
    hit_id = next(vm.id for vm in w.chat.conversation.vms if "Danube" in vm.content)
    w.conversations.new()
    send(qtbot, w, "something else")
    w.sidebar.search.setText("danube")
    qtbot.waitUntil(lambda: w.sidebar.ids() == [first], timeout=LONG)
    w.sidebar.list.setCurrentRow(0)
    assert w.chat.conversation.conv_id == first
    target = w.chat_view.widget_for(hit_id)
    assert target.property("flash") is True  # highlighted
    bar = w.chat_view.verticalScrollBar()
    vp = w.chat_view.viewport()

    def in_view() -> bool:
        return vp.rect().intersects(QRect(target.mapTo(vp, QPoint(0, 0)), target.size()))

    qtbot.waitUntil(lambda: w.chat_view.following is None, timeout=LONG)  # the layout settled:
    assert target.property("flash") is True  # still marked: until the next action
    assert in_view() and 0 < bar.value() < bar.maximum()  # the hit in view: not the top, not the bottom


@pytest.mark.parametrize("line", [0, 70])
def test_a_search_hit_in_a_message_taller_than_the_window_shows_the_hits_own_line(
    qtbot: Any, open_window: Callable[..., MainWindow], line: int
) -> None:
    from PySide6.QtCore import QRect

    from app.qt.conversation.message_widget import HIT_COLOR, MARK_COLOR

    w = open_window(max_tokens=4)
    w.resize(900, 600)
    lines = [f"line {i}: the notes go on about the weather and the sea" for i in range(90)]
    lines[line] += ", and the Danube"
    send(qtbot, w, "\n".join(lines))
    for i in range(3):
        send(qtbot, w, f"filler message {i} " + "words " * 40)
    hit_id = w.chat.conversation.vms[0].id
    view = w.chat_view
    bar, vp = view.verticalScrollBar(), view.viewport()
    qtbot.waitUntil(lambda: bar.value() == bar.maximum() > 0, timeout=LONG)
    target = view.widget_for(hit_id)
    assert target.height() > 2 * vp.height()  # a message much taller than the window
    w.sidebar.search.setText("danube")
    qtbot.waitUntil(lambda: w.sidebar.hit_for(w.chat.conversation.conv_id) == hit_id, timeout=LONG)
    w.conversations.reveal(hit_id)  # what a click on the hit in the list does
    qtbot.waitUntil(lambda: view.following is None, timeout=LONG)
    body = target.body
    # The hit: its own line, marked stronger than any other match.
    assert body.marked() == ["Danube"]
    assert body.extraSelections()[0].format.background().color().name() == HIT_COLOR != MARK_COLOR
    hit = body.hit_line()
    shown = QRect(body.viewport().mapTo(vp, hit.topLeft()), hit.size())
    assert vp.rect().contains(shown), (shown, vp.rect())  # the hit's line in view, whole
    top = target.mapTo(vp, target.rect().topLeft()).y()
    assert top < 0 or top + target.height() > vp.height()  # not the whole message: its line
    assert target.property("flash") is True


def test_a_selected_search_result_is_drawn_readably_on_the_selection(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    """The style sheet gives a selected row a pale background and the text colour; the search
    result's rich text must follow it, not the palette's highlighted text (white). Its title
    (the first line, where the word found is not: the mark draws its own black on yellow) is
    what is measured."""
    from app.qt.conversation.sidebar import MARKED_ROLE

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


# -- 12. closing while a search waits -------------------------------------------------------------
def test_a_search_typed_just_before_closing_never_reaches_the_closed_store(
    qtbot: Any, open_window: Callable[..., MainWindow]  # noqa: F811
) -> None:
    w = open_window(max_tokens=4)
    send(qtbot, w, "fruit salad")
    qtbot.keyClicks(w.sidebar.search, "fruit")  # debounced: the search starts once typing pauses
    w.close()  # the store closes with the window
    w.sidebar.search.setText("")  # a late change (Qt clears a field as it goes): nothing runs
    w.sidebar.searchChanged.emit("fruit")
    w.chat.listing.search("fruit")
    w.chat.listing.refresh()  # pytest-qt fails the test on an exception raised in any of these
    assert w.engine_closed and w.windowTitle() == "fruit salad — Verbatim"


def test_an_empty_search_says_so_in_the_list(qtbot: Any, open_window: Callable[..., MainWindow]) -> None:
    w = open_window(max_tokens=4)
    send(qtbot, w, "apples and pears")
    w.sidebar.search.setText("zebras")
    empty = w.sidebar.empty
    qtbot.waitUntil(lambda: empty.isVisibleTo(w), timeout=LONG)
    assert empty.text() == "No conversations match “zebras”." and not w.sidebar.list.isVisibleTo(w)
    w.sidebar.search.clear()
    qtbot.waitUntil(lambda: w.sidebar.list.isVisibleTo(w) and not empty.isVisibleTo(w), timeout=LONG)


def test_composer_grows_with_wrapped_lines_and_the_open_chat_is_highlighted_after_restart(
    qtbot: Any, open_window: Callable[..., MainWindow], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    w = open_window(data, max_tokens=4)
    two_lines = w.composer.height()
    w.composer.setPlainText("word " * 6000)  # a 30,000-character paste, no line breaks
    assert w.composer.height() > 3 * two_lines  # grown to its 10 lines (then it scrolls)
    w.composer.setPlainText("short")
    qtbot.waitUntil(lambda: w.composer.height() == two_lines, timeout=LONG)
    send(qtbot, w, "first chat")
    w.conversations.new()
    send(qtbot, w, "second chat")
    w.close()
    w2 = open_window(data)
    assert w2.chat.conversation.conv_id is not None and w2.sidebar.current_id() == w2.chat.conversation.conv_id
    assert w2.sidebar.list.currentItem().isSelected()


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
    w.conversations.export(w.chat.conversation.conv_id)
    # In the documents folder (platformdirs), not the process's working directory.
    # (Home where there is no documents folder: Qt's dialog would open the working directory.)
    start = documents_dir() if documents_dir().is_dir() else Path.home()
    assert suggested == [str(start / "Why is the sky blue.md")]
    folder = tmp_path / "exports"
    folder.mkdir()
    answer[0] = str(folder / "sky.md")
    w.conversations.export(w.chat.conversation.conv_id)
    assert "Why is the sky blue?" in (folder / "sky.md").read_text(encoding="utf-8")
    w.inspector.export_receipt(replies(w)[-1].id)  # the receipt dialog starts in the folder used last
    assert suggested[-1] == str(folder / "Why is the sky blue - reply 1.receipt.json")


def test_export_and_receipt_names_say_the_title_without_its_ellipsis_and_the_variant_shown(
    qtbot: Any, open_window: Callable[..., MainWindow], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from app.core import ops
    from app.qt import dialogs
    from tests.gui.driver import click, wait_idle

    w = open_window(max_tokens=4)
    send(qtbot, w, "Why is the sky blue in the evening and red in the morning, and what about clouds?")
    title = w.session.title(w.chat.conversation.conv_id)
    assert title.endswith("…")  # a long first message: the title is cut
    click(qtbot, w, "newVariantButton")
    wait_idle(qtbot, w)
    first, second = w.session.store.siblings(replies(w)[-1].id)
    suggested: list[str] = []
    monkeypatch.setattr(dialogs.QFileDialog, "getSaveFileName",
                        lambda parent, caption, name, filters: (suggested.append(Path(name).name), ("", ""))[1])
    w.conversations.export(w.chat.conversation.conv_id)
    stem = title.rstrip("…").rstrip()
    assert suggested[-1] == f"{stem}.md"  # no "…" in a file name
    # The receipt names the reply and the variant shown, never a database id.
    w.inspector.export_receipt(second.id)
    assert suggested[-1] == f"{stem} - reply 1, variant 2 of 2.receipt.json"
    ops.switch_variant(w.chat, first.id)
    w.inspector.export_receipt(first.id)
    assert suggested[-1] == f"{stem} - reply 1, variant 1 of 2.receipt.json"


def test_a_notice_too_long_for_the_status_bar_is_said_whole_in_the_notice_area(
    qtbot: Any, open_window: Callable[..., MainWindow], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from app.qt import dialogs

    w = open_window(max_tokens=4)
    w.resize(*w.MIN_SIZE)
    send(qtbot, w, "Why is the sky blue?")
    folder = tmp_path / "a folder with a rather long name" / "and another one inside it, also long"
    folder.mkdir(parents=True)
    target = str(folder / "Why is the sky blue.md")
    monkeypatch.setattr(dialogs.QFileDialog, "getSaveFileName", lambda *a: (target, ""))
    w.conversations.export(w.chat.conversation.conv_id)
    said = f"Exported to {target}"
    bar = w.statusBar()
    assert bar.fontMetrics().horizontalAdvance(said) > w.status_line.room()  # it would be cut there
    assert w.notice.isVisible() and w.notice.text() == said and bar.currentMessage() == ""
    # A short one stays in the status bar (a short folder: tmp_path's length, and the room the
    # status bar's memory label leaves, vary from run to run).
    w.chat.notices.tell("")
    short_dir = Path(tempfile.mkdtemp(prefix="v", dir="/tmp"))
    short = str(short_dir / "x.md")
    monkeypatch.setattr(dialogs.QFileDialog, "getSaveFileName", lambda *a: (short, ""))
    try:
        w.conversations.export(w.chat.conversation.conv_id)
        assert bar.fontMetrics().horizontalAdvance(f"Exported to {short}") <= w.status_line.room()
        assert bar.currentMessage() == f"Exported to {short}" and not w.notice.isVisible()
    finally:
        shutil.rmtree(short_dir, ignore_errors=True)


def test_an_imported_conversation_is_marked_listed_first_and_selected(
    qtbot: Any, open_window: Callable[..., MainWindow], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from app.qt import dialogs

    w = open_window(max_tokens=4)
    send(qtbot, w, "An old question")
    old = w.chat.conversation.conv_id
    path = tmp_path / "old.json"
    path.write_text(w.session.export(old, as_json=True), encoding="utf-8")
    w.conversations.new()
    send(qtbot, w, "A newer question")
    monkeypatch.setattr(dialogs, "import_path", lambda parent, settings: str(path))
    w.conversations.import_()
    new = w.chat.conversation.conv_id
    assert new not in (old, None) and w.session.title(new) == "An old question (imported)"
    assert w.sidebar.ids()[0] == new and w.sidebar.current_id() == new  # first in the list, and selected
    assert w.sidebar.list.currentItem().isSelected() and w.sidebar.list.currentItem().text() == "An old question (imported)"


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
    w.conversations.export(w.chat.conversation.conv_id)
    assert Path(suggested[-1]).parent == docs  # the user's Documents (as the other dialogs)
    docs.rmdir()  # a system with no Documents folder (a fresh account, a container): Qt would open the cwd
    w.conversations.export(w.chat.conversation.conv_id)
    assert Path(suggested[-1]).parent == Path.home() and Path(suggested[-1]).parent.is_dir()


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
    w.conversations.import_()
    assert errors.last_error.startswith("reply.receipt.json is a receipt of one reply, not a conversation")
    assert f"python -m engine verify {path}" in errors.last_error
    assert len(w.sidebar.ids()) == 1  # nothing imported
