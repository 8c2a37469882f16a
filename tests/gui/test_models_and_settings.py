"""The model and the conversation's settings in the real window (pytest-qt, offscreen, the tiny
real model): a broken model says so, the model manager lists, imports and reports download errors,
a GGUF imported before says so in plain English, settings apply to the next reply and a context
limit stays the conversation's own, the system prompt placeholder shows what the model gets."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox, QPushButton

from app.core import ops
from app.qt.window.window import MainWindow
from tests.gui.driver import LONG, LONG_PROMPT, replies, send, settings, wait_idle, watch

pytestmark = pytest.mark.gui



# -- 8b. the system prompt placeholder says what the model gets -------------------------------------------
def _placeholder_shown(qtbot: Any, w: MainWindow) -> str:
    """Settings opened from the window; the system prompt field's placeholder, then closed."""
    from PySide6.QtCore import QTimer

    from app.qt.conversation.settings_dialog import SettingsDialog

    seen: list[str] = []

    def look() -> None:
        dlg = next(d for d in w.findChildren(SettingsDialog, "settingsDialog") if d.isVisible())
        seen.append(dlg.system_prompt.placeholderText())
        dlg.reject()

    QTimer.singleShot(0, look)
    w.settings.open_dialog()
    return seen[0]


def test_broken_model_shows_error(qtbot: Any, open_window: Callable[..., MainWindow], tmp_path: Path) -> None:
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{ this is not json")
    w = open_window(model=str(broken), wait=False)
    qtbot.waitUntil(lambda: watch(w).last_error is not None, timeout=LONG)
    box = w.findChild(QMessageBox, "errorDialog")
    assert box is not None and box.isVisible()
    assert "broken-model" in box.text() and "config.json" in box.text()
    assert not w.chat.link.ready and w.models.model_label.text() == "No model"
    box.close()
    # Sending without a model: the message is kept, the failure is explained.
    watch(w).errors.clear()
    send(qtbot, w, "hello?")
    assert watch(w).last_error and "no model" in watch(w).last_error.lower()
    assert [vm.role for vm in w.chat.conversation.vms] == ["user"]


def test_model_manager_lists_imports_and_reports_download_errors(
    qtbot: Any, open_window: Callable[..., MainWindow], tiny_model: Path, tmp_path: Path, monkeypatch: Any
) -> None:
    from tests.gguf_fixtures import tiny_llama_gguf

    monkeypatch.setenv("VERBATIM_CACHE_DIR", str(tmp_path / "vcache"))  # imports land here
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network here: the error must be clear
    w = open_window(max_tokens=4)
    mgr = w.models.open_manager()
    qtbot.waitUntil(lambda: "found" in mgr.status.text() or "No models" in mgr.status.text(), timeout=LONG)
    before = len(mgr.entries)
    # Import a GGUF (on the engine thread, with progress), then it is listed and usable.
    gguf = tiny_llama_gguf(tiny_model, tmp_path / "tiny.gguf")
    steps: list[float] = []
    mgr.progressed.connect(lambda f, m: steps.append(f))
    mgr.import_gguf(str(gguf))
    assert mgr.cancel_button.isVisible()
    qtbot.waitUntil(lambda: "Imported" in mgr.status.text() or "failed" in mgr.status.text(), timeout=LONG)
    assert "Imported" in mgr.status.text(), mgr.status.text()
    assert steps and max(steps) > 0
    qtbot.waitUntil(lambda: len(mgr.entries) == before + 1, timeout=LONG)
    # Download with no network: a clear one-line error in the dialog.
    mgr.repo.setText("mlx-community/does-not-exist-4bit")
    qtbot.mouseClick(mgr.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "Download failed" in mgr.status.text(), timeout=LONG)
    assert mgr.status.property("error") is True
    # A corrupt GGUF: one clear line. A cancelled import (queued behind a long reply): "cancelled".
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    mgr.import_gguf(str(bad))
    qtbot.waitUntil(lambda: "Import failed" in mgr.status.text(), timeout=LONG)
    assert "broken.gguf" in mgr.status.text() or "GGUF" in mgr.status.text()
    w.settings.apply(settings(3000))
    send(qtbot, w, "a long reply keeps the engine busy", wait=False)
    mgr.import_gguf(str(gguf))
    qtbot.mouseClick(mgr.cancel_button, Qt.MouseButton.LeftButton)
    ops.stop(w.chat)
    wait_idle(qtbot, w)
    qtbot.waitUntil(lambda: "Import cancelled" in mgr.status.text(), timeout=LONG)
    assert mgr.import_button.isEnabled() and not mgr.cancel_button.isVisible()
    w.settings.apply(settings(4))
    # Use the imported model.
    row = next(i for i, e in enumerate(mgr.entries) if e.source == "gguf")
    mgr.table.selectRow(row)
    qtbot.mouseClick(mgr.use_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.chat.link.ready, timeout=LONG)
    assert w.model_picker.currentData() == str(mgr.entries[row].path)
    send(qtbot, w, "hello")
    assert replies(w)[-1].status == "complete"


def test_model_manager_has_a_close_button(qtbot: Any, open_window: Callable[..., MainWindow]) -> None:
    w = open_window()
    dlg = w.models.open_manager()
    qtbot.waitUntil(dlg.isVisible, timeout=LONG)
    qtbot.mouseClick(dlg.findChild(QPushButton, "closeManagerButton"), Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not dlg.isVisible(), timeout=LONG)


# -- 8h. plain English for a model imported before ---------------------------------------------------------
def test_loading_a_gguf_imported_before_says_so_in_plain_english(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    w = open_window(model="demo", max_tokens=4)  # the demo is a GGUF: imported by now
    shown: list[str] = []
    w.chat.link.progress.connect(lambda *a: shown.append(w.model_status.text()))
    w.models.load("demo")  # again: its content was converted already
    qtbot.waitUntil(lambda: w.chat.link.ready, timeout=LONG)
    assert "imported before: using the converted copy · loading…" in shown, shown
    assert not any("already imported" in s or "100%" in s for s in shown), shown


def test_the_header_says_loading_until_the_model_is_loaded(
    qtbot: Any, open_window: Callable[..., MainWindow], tiny_model: Path, tmp_path: Path, monkeypatch: Any
) -> None:
    from tests.gguf_fixtures import tiny_llama_gguf

    monkeypatch.setenv("VERBATIM_CACHE_DIR", str(tmp_path / "vcache"))  # a first import: converted now
    gguf = tiny_llama_gguf(tiny_model, tmp_path / "tiny.gguf")
    w = open_window(model=str(gguf), wait=False)
    shown: list[tuple[float, str]] = []
    w.chat.link.progress.connect(lambda f, m: shown.append((f, w.model_status.text())))
    qtbot.waitUntil(lambda: w.chat.link.ready, timeout=LONG)
    assert shown and shown[-1][0] == 1.0, shown  # the import's last step ended before the load did
    assert all(text != "done" and "loading" in text for f, text in shown if f >= 1), shown
    assert "layers · loaded in" in w.model_status.text()


def test_an_error_says_its_text_as_a_sentence(qtbot: Any, open_window: Callable[..., MainWindow], tmp_path: Path) -> None:
    w = open_window(model=str(tmp_path / "no-such-model"), wait=False)
    qtbot.waitUntil(lambda: watch(w).last_error is not None, timeout=LONG)
    box = w.findChild(QMessageBox, "errorDialog")
    assert watch(w).last_error.startswith("No such file or folder: ") and box.text() == watch(w).last_error
    box.close()


def test_window_moves_an_old_prompt_cache_to_its_cache_folder(
    qtbot: Any, open_window: Callable[..., MainWindow], tmp_path: Path
) -> None:
    data, cache = tmp_path / "data", tmp_path / "user-cache" / "prompt-cache"
    (data / "cache" / "snapshots").mkdir(parents=True)
    (data / "cache" / "old-marker").write_text("from the old place")
    w = open_window(data, cache_dir=cache)
    assert w.cache_dir == cache and not (data / "cache").exists()
    assert (cache / "old-marker").read_text() == "from the old place"
    send(qtbot, w, "hello")
    assert replies(w)[-1].status == "complete"


def test_settings_apply_to_the_next_reply(qtbot: Any, open_window: Callable[..., MainWindow]) -> None:
    from app.qt.conversation.settings_dialog import SettingsDialog

    w = open_window()
    dlg = SettingsDialog(w.chat.conversation.settings(), w)
    qtbot.addWidget(dlg)
    dlg.max_tokens.setValue(5)
    dlg.random_seed.setChecked(False)
    dlg.seed.setValue(1234)
    dlg.mode.setCurrentIndex(dlg.mode.findData("fast"))
    dlg.system_prompt.setPlainText("You are terse.")
    w.settings.apply(dlg.value())
    assert "fast" in w.reply_bar.summary.text() and "seed 1234" in w.reply_bar.summary.text()
    send(qtbot, w, "hi")
    reply = w.session.store.get_message(replies(w)[-1].id)
    assert reply.seed == 1234 and len(reply.tokens) <= 5 and reply.cache_report["mode"] == "fast"
    assert w.session.store.messages_for_prompt(w.chat.conversation.conv_id, reply.parent_id)[0] == {"role": "system", "content": "You are terse."}


def test_a_conversation_context_limit_does_not_carry_into_new_chats(
    qtbot: Any, open_window: Callable[..., MainWindow]  # noqa: F811
) -> None:
    w = open_window(max_tokens=4)
    send(qtbot, w, "hello")
    w.settings.apply(replace(w.chat.conversation.settings(), context_length=300))  # "as default", as the dialog's box is
    assert w.chat.conversation.settings().context_length == 300  # this conversation's
    w.conversations.new()
    assert w.chat.conversation.settings().context_length == 0  # a new chat: the model's own context
    send(qtbot, w, "a new chat")
    assert w.chat.conversation.settings().context_length == 0 and w.chat.conversation.settings().sampler.max_tokens == 4


@pytest.mark.parametrize("model", ["demo", "tiny"])
def test_the_system_prompt_placeholder_shows_what_the_model_gets(
    qtbot: Any, open_window: Callable[..., MainWindow], tiny_model: Path, model: str
) -> None:
    w = open_window(model="demo" if model == "demo" else str(tiny_model), max_tokens=4)
    qtbot.waitUntil(lambda: w.chat.link.template_system is not None, timeout=LONG)  # rendered on the engine thread
    if model == "demo":  # SmolLM2's template puts its own in when there is no system message
        assert _placeholder_shown(qtbot, w) == ("None set: the model's chat template adds its own: “You are a "
                                                "helpful AI assistant named SmolLM, trained by Hugging Face”")
    else:
        assert _placeholder_shown(qtbot, w) == "None set: the model gets no system prompt (its chat template adds none)"


# -- issue 50, item 7: the memory, visible and bounded ----------------------------------------------------
def refreshed(qtbot: Any, w: MainWindow) -> None:
    """The engine link read the cache's numbers and the memory again (after every engine job
    asked before: the engine thread runs them in order)."""
    done: list[bool] = []

    async def read() -> None:  # this read, not one asked before it (the dialog asks for one too)
        await w.chat.link.refresh_stats()
        done.append(True)

    w.chat.jobs.spawn(read())
    qtbot.waitUntil(lambda: bool(done), timeout=LONG)


def test_settings_show_the_memory_and_change_the_prompt_caches_budget_at_once_and_at_the_next_start(
    qtbot: Any, open_window: Callable[..., MainWindow], tmp_path: Path
) -> None:
    from PySide6.QtCore import QTimer

    from app.qt.conversation.settings_dialog import SettingsDialog
    from engine.memory import MIB, default_memory_budget

    data = tmp_path / "kept"
    w = open_window(data_dir=data, max_tokens=4)
    for i in range(3):  # three conversations' states in the memory tier
        w.conversations.new()
        send(qtbot, w, f"Question {i}: " + LONG_PROMPT)
    link = w.chat.link
    refreshed(qtbot, w)
    before = link.memory_report
    assert before is not None and before.tier_entries >= 3 and before.tier_budget == default_memory_budget() and before.weights > 0 and before.tier > MIB
    # The debug panel shows the process's memory split, read again after the run.
    w.menus.debug_action.trigger()
    assert w.debug_panel.process_memory.text() == "\n".join(before.lines())
    assert w.debug_panel.memory_box.title() == "Memory (this process)"

    seen: dict[str, str] = {}

    def set_budget() -> None:
        dlg = next(d for d in w.findChildren(SettingsDialog, "settingsDialog") if d.isVisible())
        seen.update(budget=dlg.memory_budget.text(), now=dlg.memory_now.text(), split=dlg.memory_split.text())
        dlg.memory_budget.setValue(1)  # 1 MB: less than the tier holds
        dlg.accept()

    QTimer.singleShot(0, set_budget)
    w.settings.open_dialog()
    assert seen["budget"] == f"default ({default_memory_budget() / MIB:,.0f} MB for this machine)"
    assert seen["now"] == (f"Holds {before.tier / MIB:,.0f} MB now of {before.tier_budget / MIB:,.0f} MB "
                           f"({before.tier_entries} snapshots).")
    assert seen["split"].splitlines()[0] == before.lines()[0]  # "Model weights: …"
    # Applied at once: the tier evicts down to the new budget, and the panel shows it.
    refreshed(qtbot, w)
    after = link.memory_report
    assert after.tier_budget == MIB and after.tier <= MIB and after.tier_entries < before.tier_entries
    assert w.debug_panel.process_memory.text() == "\n".join(after.lines())
    assert int(w.qsettings.value("engine/memory_budget")) == MIB
    w.close()
    # Kept: the next start's engine has it.
    again = open_window(data_dir=data, max_tokens=4)
    refreshed(qtbot, again)
    assert again.chat.link.memory_report.tier_budget == MIB and again.chat.link.memory_budget == MIB
