"""Documents in the window (issue 38), through the real window (pytest-qt, offscreen) on the tiny
real model: attach by the button and by a drop, chips with pages and tokens, removable before
Send, bad files refused naming them, the document kept with its message (regenerate, edit,
export and import), shared by a new conversation and after a restart, the meter counting it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QFileDialog, QToolButton, QWidget  # noqa: E402

from app.core import ops  # noqa: E402
from app.core.conversation.listing import items
from app.core.conversation.model import read_path
from app.qt.window.window import MainWindow  # noqa: E402
from tests.document_files import docx_bytes, pdf_bytes  # noqa: E402
from tests.gui.driver import LONG, chips, counted, drop, replies, send, wait_idle  # noqa: E402

pytestmark = pytest.mark.gui

PAGES = ["Quarterly report. Revenue grew by twelve percent to 4.2 million.",
         "Costs fell by three percent. The board approved a dividend."]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    folder = tmp_path / "files"
    folder.mkdir()
    out = {
        "pdf": folder / "report.pdf", "md": folder / "notes.md", "docx": folder / "contract.docx",
        "secret": folder / "secret.pdf", "blob": folder / "blob.bin",
    }  # fmt: skip
    out["pdf"].write_bytes(pdf_bytes(PAGES))
    out["md"].write_text("# Notes\n\nShip on Friday. Ann reviews the numbers.\n")
    out["docx"].write_bytes(docx_bytes(["Clause 1. Pay within 30 days."], [["Party", "Role"], ["Ann", "Buyer"]]))
    out["secret"].write_bytes(pdf_bytes(["hidden"], password="pw"))
    out["blob"].write_bytes(bytes(range(256)) * 64)
    return out


def attach_by_button(qtbot: Any, w: MainWindow, monkeypatch: pytest.MonkeyPatch, *paths: Path) -> list[str]:
    """Click the attach button and pick `paths` in the file dialog; returns the folder the dialog started in."""
    started: list[str] = []

    def pick(parent: QWidget, caption: str, folder: str, filters: str) -> tuple[list[str], str]:
        started.append(folder)
        return [str(p) for p in paths], filters

    monkeypatch.setattr(QFileDialog, "getOpenFileNames", staticmethod(pick))
    qtbot.mouseClick(w.findChild(QToolButton, "attachButton"), Qt.MouseButton.LeftButton)
    return started


def tokens_of(chip: str) -> int:
    m = re.search(r"([\d,]+) tokens", chip)
    assert m, chip
    return int(m.group(1).replace(",", ""))


def test_attach_by_button_shows_name_pages_and_tokens_and_a_chip_can_be_removed_before_sending(
    qtbot: Any, open_window: Callable[..., MainWindow], files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    w = open_window()
    started = attach_by_button(qtbot, w, monkeypatch, files["pdf"], files["md"])
    assert started and Path(started[0]) != Path.cwd()  # the user's Documents folder, not the working dir
    qtbot.waitUntil(counted(w, 2), timeout=LONG)
    pdf_chip, md_chip = chips(w)
    assert pdf_chip.startswith("report.pdf · 2 pages · ") and md_chip.startswith("notes.md · ")
    # The meter counts both: the chips' sum (one count: each chip is the engine's own).
    w.composer.setPlainText("What grew?")
    qtbot.waitUntil(lambda: w.chat.composer.budget is not None and w.chat.composer.budget.documents > 0, timeout=LONG)
    both = w.chat.composer.budget.documents
    assert both == tokens_of(pdf_chip) + tokens_of(md_chip)
    assert f"(documents: {both:,})" in w.chat.composer.budget.tooltip
    tip = w.attach.bar.chips.chips[0].toolTip()
    assert f"{tokens_of(pdf_chip):,} tokens: its part of the system message in this conversation (its name, its text" in tip
    # × on the second chip: it is gone before anything is sent, and the prompt grows by exactly
    # what the remaining chip says.
    w.attach.bar.chips.chips[1].remove_button.click()
    qtbot.waitUntil(lambda: chips(w) == [pdf_chip], timeout=LONG)
    qtbot.waitUntil(lambda: w.chat.composer.budget.documents != both, timeout=LONG)
    assert w.chat.composer.budget.documents == tokens_of(pdf_chip)
    send(qtbot, w, "What grew?")
    user = next(vm for vm in w.chat.conversation.vms if vm.role == "user")
    assert [d.name for d in user.documents] == ["report.pdf"] and user.documents[0].pages == 2
    assert w.chat_view.widget_for(user.id).doc_chips.texts() == ["report.pdf · 2 pages"]
    assert chips(w) == [] and not w.chat.composer.attachments.items  # sent with the message
    rows = w.session.store.documents([user.id])[user.id]
    assert rows[0].digest == __import__("hashlib").sha256(files["pdf"].read_bytes()).hexdigest()
    assert "Quarterly report" in rows[0].text
    report = replies(w)[-1].report
    assert [(d["name"], d["source"]) for d in report.documents] == [("report.pdf", "prefilled")]
    assert report.documents[0]["tokens"] == tokens_of(pdf_chip)  # the report's count is the chip's
    # The engine keeps the file's state warm while a conversation has it, and no longer after.
    in_use = lambda: w.chat.jobs.executor.submit(lambda engine: engine.eviction.in_use).result()  # noqa: E731
    assert in_use() == {rows[0].digest}
    w.conversations.delete(w.chat.conversation.conv_id, confirm=False)
    send(qtbot, w, "Anything else?")
    assert in_use() == frozenset()


def test_a_dropped_file_is_attached_not_pasted_on_the_composer_and_on_the_conversation(
    qtbot: Any, open_window: Callable[..., MainWindow], files: dict[str, Path]
) -> None:
    w = open_window()
    w.composer.setPlainText("About this:")
    assert drop(w.composer, files["docx"]) == (True, True)
    qtbot.waitUntil(counted(w, 1), timeout=LONG)
    assert w.composer.toPlainText() == "About this:"  # the path was not pasted into the text
    assert drop(w.chat_view.viewport(), files["md"]) == (True, True)
    qtbot.waitUntil(counted(w, 2), timeout=LONG)
    assert [c.split(" · ")[0] for c in chips(w)] == ["contract.docx", "notes.md"]
    assert "Pay within 30 days" in w.chat.composer.attachments.items[0].document.text
    assert drop(w.composer, files["md"]) == (True, True)  # the same file again: not attached twice
    qtbot.waitUntil(lambda: "notes.md: already attached" in w.attach.bar.note.text(), timeout=LONG)
    assert len(chips(w)) == 2


def test_files_that_cannot_be_read_are_refused_naming_each_and_the_others_still_attach(
    qtbot: Any, open_window: Callable[..., MainWindow], files: dict[str, Path]
) -> None:
    w = open_window()
    w.composer.setPlainText("Read these")
    drop(w.composer, files["secret"], files["blob"], files["md"])
    qtbot.waitUntil(lambda: w.attach.bar.note.isVisibleTo(w) and counted(w, 1)(), timeout=LONG)
    note = w.attach.bar.note.text()
    assert note.startswith("Not attached: ")
    assert "secret.pdf: the PDF is encrypted" in note and "blob.bin: " in note
    assert chips(w)[0].startswith("notes.md")
    assert w.composer.toPlainText() == "Read these"  # nothing typed is lost
    assert w.attach.bar.note.wordWrap()  # the explanation wraps: it is not cut at any width


def test_regenerate_about_a_document_is_identical_and_a_new_conversation_restores_it(
    qtbot: Any, open_window: Callable[..., MainWindow], files: dict[str, Path]
) -> None:
    w = open_window()
    drop(w.composer, files["pdf"])
    qtbot.waitUntil(counted(w, 1), timeout=LONG)
    send(qtbot, w, "What grew?")
    first = replies(w)[-1]
    ops.regenerate(w.chat)
    wait_idle(qtbot, w)
    again = replies(w)[-1]
    assert again.report.identical is True and again.report.restored == again.report.prompt_tokens - 1
    assert again.report.documents[0]["source"] == "memory"
    # A new conversation about the same file: its state is restored, only the question is new.
    w.conversations.new()
    drop(w.composer, files["pdf"])
    qtbot.waitUntil(counted(w, 1), timeout=LONG)
    send(qtbot, w, "What fell?")
    r = replies(w)[-1].report
    doc = r.documents[0]
    assert doc["source"] == "memory" and r.restored >= doc["end"] == first.report.documents[0]["end"]
    w.debug_panel.show()
    w.chat.conversation.select(replies(w)[-1].id)
    assert w.debug_panel.document_box.isVisibleTo(w.debug_panel)
    assert w.debug_panel.documents.text().startswith(f"report.pdf: {doc['tokens']:,} tokens")
    assert "restored from memory" in w.debug_panel.documents.text()


def test_after_a_restart_the_document_is_restored_from_disk_and_shown_so(
    qtbot: Any, open_window: Callable[..., MainWindow], files: dict[str, Path], tmp_path: Path
) -> None:
    data = tmp_path / "restart"
    w = open_window(data_dir=data)
    drop(w.composer, files["pdf"])
    qtbot.waitUntil(counted(w, 1), timeout=LONG)
    send(qtbot, w, "What grew?")
    end = replies(w)[-1].report.documents[0]["end"]
    w.close()  # flushes the prompt cache's disk tier
    w2 = open_window(data_dir=data)
    w2.conversations.new()  # (the window reopens the last conversation, which has the file already)
    drop(w2.composer, files["pdf"])
    qtbot.waitUntil(counted(w2, 1), timeout=LONG)
    send(qtbot, w2, "What fell?")
    r = replies(w2)[-1].report
    assert r.documents[0]["source"] == "disk" and r.restored >= end
    w2.debug_panel.show()
    w2.chat.conversation.select(replies(w2)[-1].id)
    assert "restored from disk" in w2.debug_panel.documents.text()


def test_an_edit_keeps_the_documents_and_export_import_carries_them(
    qtbot: Any, open_window: Callable[..., MainWindow], files: dict[str, Path]
) -> None:
    w = open_window()
    drop(w.composer, files["md"])
    qtbot.waitUntil(counted(w, 1), timeout=LONG)
    send(qtbot, w, "When do we ship?")
    user = next(vm for vm in w.chat.conversation.vms if vm.role == "user")
    ops.edit(w.chat, user.id, "Who reviews the numbers?")
    wait_idle(qtbot, w)
    edited = next(vm for vm in w.chat.conversation.vms if vm.role == "user")
    assert edited.id != user.id and [d.digest for d in edited.documents] == [d.digest for d in user.documents]
    assert replies(w)[-1].report.documents[0]["name"] == "notes.md"
    exported = w.session.export(w.chat.conversation.conv_id, as_json=True)
    rows = [m for m in json.loads(exported)["messages"] if m.get("documents")]
    assert len(rows) == 2 and rows[0]["documents"][0]["text"].startswith("# Notes")
    new_id = w.session.import_conversation(exported.encode())
    imported = read_path(w.session, new_id)
    assert [d.name for d in imported[0].documents] == ["notes.md"]
    assert imported[0].documents[0].digest == edited.documents[0].digest
    markdown = w.session.export(w.chat.conversation.conv_id, as_json=False)
    assert "*Attached: notes.md (sha256 " in markdown
    # A hostile file: documents on a reply are refused, nothing is imported.
    bad = json.loads(exported)
    bad["messages"][1]["documents"] = bad["messages"][0]["documents"]
    before = len(items(w.session))
    with pytest.raises(Exception, match="only a user message can carry documents"):
        w.session.import_conversation(json.dumps(bad).encode())
    assert len(items(w.session)) == before


def test_a_document_too_long_for_the_context_is_refused_before_sending_with_what_would_fit(
    qtbot: Any, open_window: Callable[..., MainWindow], files: dict[str, Path], tmp_path: Path
) -> None:
    from tests.gui.driver import settings

    w = open_window()
    w.settings.apply(settings(24, context_length=400))
    big = tmp_path / "files" / "long.pdf"
    big.write_bytes(pdf_bytes([f"Page {i}. " + "The numbers went up and then down again. " * 12 for i in range(8)]))
    drop(w.composer, big)
    qtbot.waitUntil(counted(w, 1), timeout=LONG)
    w.composer.setPlainText("Summarise it")
    qtbot.waitUntil(lambda: "Too long: the documents" in w.context_meter.warning.text(), timeout=LONG)
    warning = w.context_meter.warning.text()
    assert "400-token context" in warning and "documents are never cut" in warning
    assert re.search(r"attach about \d+ of the 8 pages", warning) and "remove a document" in warning
    assert not w.reply_bar.send_button.isEnabled() or not ops.send(w.chat, "Summarise it")
    assert w.chat.conversation.conv_id is None and not w.chat.conversation.vms  # nothing saved
    assert len(w.chat.composer.attachments.items) == 1  # the file stays attached


@pytest.mark.parametrize("how", ["enter while the file is read", "enter after its chip shows the count",
                                 "send clicked before the count"])
def test_a_draft_whose_documents_cannot_fit_is_refused_before_anything_is_saved_however_it_is_sent(
    qtbot: Any, open_window: Callable[..., MainWindow], tmp_path: Path, how: str
) -> None:
    from tests.gui.driver import settings, status_said

    w = open_window()
    w.settings.apply(settings(24, context_length=400))
    send(qtbot, w, "Hello there")  # a conversation with a reply: what it holds must not change
    conv = w.chat.conversation.conv_id
    before = [(m.id, m.content) for m in w.session.store.messages(conv)]
    huge = tmp_path / "huge.txt"
    huge.write_text("The numbers went up and then down again, every quarter of every year. " * 300)
    drop(w.composer, huge)
    if how != "enter while the file is read":
        qtbot.waitUntil(counted(w, 1), timeout=LONG)
    w.composer.setFocus()
    if how == "send clicked before the count":
        w.composer.setPlainText("Summarise it")
        qtbot.mouseClick(w.reply_bar.send_button, Qt.MouseButton.LeftButton)
    else:
        qtbot.keyClicks(w.composer, "Summarise it")
        qtbot.keyClick(w.composer, Qt.Key.Key_Return)
    c = w.chat.composer
    qtbot.waitUntil(lambda: w.chat.generation.busy or (c.queued is None and c.counted("Summarise it")), timeout=LONG)
    # Nothing saved: the conversation is as it was; the draft and its file are kept.
    assert not w.chat.generation.busy
    assert [(m.id, m.content) for m in w.session.store.messages(conv)] == before
    assert w.composer.toPlainText() == "Summarise it" and [d.name for d in w.chat.composer.attachments.documents] == ["huge.txt"]
    # Send disabled, with the reason; the meter and the chip say what would fit.
    assert not w.reply_bar.send_button.isEnabled()
    assert "Too long: the documents" in w.reply_bar.send_button.toolTip()
    assert "Too long: the documents" in w.context_meter.warning.text() and w.context_meter.warning.isVisible()
    assert "400-token context" in w.context_meter.warning.text()
    (chip,) = chips(w)
    assert re.search(r"huge\.txt · [\d,]+ tokens · too long: [\d,]+ tokens of documents fit$", chip), chip
    assert w.attach.bar.chips.chips[0].property("refused") is True
    assert "Too long: the documents" in status_said(w)
    # Enter again: still nothing.
    qtbot.keyClick(w.composer, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: w.chat.composer.queued is None, timeout=LONG)
    assert not w.chat.generation.busy and [(m.id, m.content) for m in w.session.store.messages(conv)] == before
    # Without the file it goes.
    w.attach.bar.chips.chips[0].remove_button.click()
    qtbot.waitUntil(lambda: w.reply_bar.send_button.isEnabled(), timeout=LONG)
    qtbot.keyClick(w.composer, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: w.chat.generation.busy, timeout=LONG)
    wait_idle(qtbot, w)
    assert [vm.content for vm in w.chat.conversation.vms if vm.role == "user"] == ["Hello there", "Summarise it"]


def test_a_refused_draft_says_what_would_hold_it(qtbot: Any, open_window: Callable[..., MainWindow], tmp_path: Path) -> None:
    from app.core.engine_link.models import entry_name
    from tests.gui.driver import settings

    w = open_window()
    qtbot.waitUntil(lambda: bool(w.chat.link.models), timeout=LONG)  # the models found on this machine
    sentence = "The numbers went up and then down again, every quarter of every year. "

    def refused_with(repeats: int, name: str) -> tuple[str, int]:
        """The meter's warning with a file of `repeats` sentences attached, and the context the
        draft needs (the message alone with its file, and the reply)."""
        path = tmp_path / name
        path.write_text(sentence * repeats)
        drop(w.composer, path)
        qtbot.waitUntil(counted(w, 1), timeout=LONG)
        w.composer.setPlainText("Summarise it")
        qtbot.waitUntil(lambda: "Too long: the documents" in w.context_meter.warning.text(), timeout=LONG)
        said, need = w.context_meter.warning.text(), w.chat.composer.budget.draft + 24
        w.attach.bar.chips.chips[0].remove_button.click()
        qtbot.waitUntil(lambda: not w.context_meter.warning.isVisible(), timeout=LONG)
        return said, need

    # The conversation's own limit is what is too short: raise it (the model holds it).
    w.settings.apply(settings(24, context_length=400))
    said, need = refused_with(30, "a.txt")
    assert 400 < need <= 4096 and "raise this conversation's context limit in Settings (the model holds 4,096 tokens)" in said
    # The model's context is too short: a model found here that holds it, by name.
    w.settings.apply(settings(24))
    warning, need = refused_with(110, "b.txt")
    assert 4096 < need
    holder = min((e for e in w.chat.link.models if (e.context_length or 0) >= need), key=lambda e: e.context_length)
    assert f"use a model with a longer context: {entry_name(holder)} holds {holder.context_length:,} tokens" in warning


def test_a_message_saved_unanswerable_by_an_older_version_can_be_repaired(
    qtbot: Any, open_window: Callable[..., MainWindow], tmp_path: Path
) -> None:
    from engine.documents.bounded import read_file
    from PySide6.QtCore import QPoint

    from tests.gui.driver import click, settings, settle, watch

    w = open_window()
    huge = tmp_path / "huge.txt"
    huge.write_text("The numbers went up and then down again, every quarter of every year. " * 300)
    doc = read_file(str(huge))

    def orphan(text: str) -> int:
        """A conversation as the old build left it: the message with its documents saved, no reply."""
        conv = w.session.new_conversation(settings(24, context_length=400))
        w.session.store.add_message(conv, None, "user", text, documents=[doc])
        w.conversations.show(conv)
        qtbot.waitUntil(lambda: w.chat.conversation.conv_id == conv, timeout=LONG)
        return conv

    w.resize(1000, 600)  # the message and the reply's placeholder are taller than the view
    orphan("Summarise it")
    (user,) = w.chat.conversation.vms
    assert user.unanswered and [d.name for d in user.documents] == ["huge.txt"]
    # Answering it is refused again (nothing more is saved), and the window says how to repair it.
    click(qtbot, w, "regenerateButton")
    wait_idle(qtbot, w)
    assert "documents take" in watch(w).last_error and [vm.id for vm in w.chat.conversation.vms] == [user.id]
    assert "Take a file off it (× on its chip) or delete the message" in w.notice.text()
    # The placeholder gone, the message is shown whole (its chip with the ×): no slack holds it up.
    settle(w.chat_view)
    top = w.chat_view.widget_for(user.id).mapTo(w.chat_view.viewport(), QPoint(0, 0)).y()
    assert top >= 0 and w.chat_view.verticalScrollBar().value() == 0, top
    # Take the file off it (× on the message's chip): Regenerate answers it.
    widget = w.chat_view.widget_for(user.id)
    (chip,) = widget.doc_chips.chips
    assert chip.remove_button is not None
    chip.remove_button.click()
    qtbot.waitUntil(lambda: not w.chat.conversation.vms[0].documents, timeout=LONG)
    assert w.session.store.documents([user.id]) == {} and "huge.txt is no longer part of this message" in w.notice.text()
    assert w.chat_view.widget_for(user.id).doc_chips.chips == []
    click(qtbot, w, "regenerateButton")
    wait_idle(qtbot, w)
    assert [vm.role for vm in w.chat.conversation.vms] == ["user", "assistant"]
    assert w.chat.conversation.vms[-1].status == "complete" and not w.chat.conversation.vms[0].unanswered
    # A message with a reply keeps its files (they made the reply).
    with pytest.raises(Exception, match="has replies"):
        w.session.remove_document(user.id, 0)
    # Or delete the message.
    conv = orphan("Summarise it again")
    (user,) = w.chat.conversation.vms
    w.chat_view.widget_for(user.id).delete_button.click()
    qtbot.waitUntil(lambda: not w.chat.conversation.vms, timeout=LONG)
    assert w.session.store.messages(conv) == []


def test_attached_in_the_middle_of_a_conversation_the_window_says_what_it_costs(
    qtbot: Any, open_window: Callable[..., MainWindow], files: dict[str, Path]
) -> None:
    w = open_window()
    send(qtbot, w, "Hello there")
    first = w.chat.conversation.conv_id
    drop(w.composer, files["md"])
    qtbot.waitUntil(counted(w, 1), timeout=LONG)
    w.composer.setPlainText("And this file?")
    qtbot.waitUntil(lambda: "reads the conversation's" in w.attach.bar.note.text(), timeout=LONG)
    assert re.search(r"conversation's [\d,.k]+ earlier tokens again, once", w.attach.bar.note.text())
    # The file stays with the conversation it was attached in.
    w.conversations.new()
    qtbot.waitUntil(lambda: chips(w) == [], timeout=LONG)
    w.conversations.open(first)
    qtbot.waitUntil(lambda: [c.split(" · ")[0] for c in chips(w)] == ["notes.md"], timeout=LONG)


def test_attached_to_a_server_the_document_goes_as_a_file_part_and_a_new_conversation_restores_it(
    qtbot: Any, open_window: Callable[..., MainWindow], files: dict[str, Path], tiny_model: Path, tmp_path: Path
) -> None:
    from tests.cluster import running
    from tests.gui.driver import SERVER, connect

    w = open_window(chunk=16)
    with running(str(tiny_model), 1, tmp_path, "--chunk", "16") as server:
        connect(qtbot, w, server.url)
        qtbot.waitUntil(lambda: w.chat.link.server is not None and w.chat.link.ready, timeout=SERVER)
        drop(w.composer, files["pdf"])
        qtbot.waitUntil(counted(w, 1), timeout=SERVER)  # counted by the server's tokenizer
        local = tokens_of(chips(w)[0])
        send(qtbot, w, "What grew?", wait=False)
        qtbot.waitUntil(lambda: not w.chat.generation.busy, timeout=SERVER)
        first = replies(w)[-1].report
        assert [(d["name"], d["source"]) for d in first.documents] == [("report.pdf", "prefilled")]
        assert first.documents[0]["tokens"] == local  # one count: the server's engine's own
        w.conversations.new()
        drop(w.composer, files["pdf"])
        qtbot.waitUntil(counted(w, 1), timeout=SERVER)
        send(qtbot, w, "What fell?", wait=False)
        qtbot.waitUntil(lambda: not w.chat.generation.busy, timeout=SERVER)
        r = replies(w)[-1].report
        assert r.documents[0]["source"] == "memory" and r.restored >= r.documents[0]["end"]
