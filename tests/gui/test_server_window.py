"""The window attached to a Verbatim server, beside tests/gui/test_attached_to_server.py's main
path (pytest-qt, offscreen, the tiny real model): Send waits while the server is away and says
why, whole; one model label for every reply; replies record the server's chunk size; the cache
store rows name what they hold; the connect dialog names this computer as it is."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
from PySide6.QtCore import Qt

from app.core import ops
from app.qt.window.window import MainWindow
from tests.gui.driver import LONG, replies, send, watch

pytestmark = pytest.mark.gui



def _whole(label: Any) -> bool:
    """The label shows all of its text: wrapped, and as tall as its text at its width, inside the window."""
    return label.wordWrap() and label.height() >= label.needed_height(label.width()) and label.isVisibleTo(label.window())


# -- 1. typing while the server is away -----------------------------------------------------------
def test_the_composer_stays_editable_and_send_waits_while_the_server_is_away(
    qtbot: Any, open_window: Callable[..., MainWindow], tiny_model: Path, tmp_path: Path  # noqa: F811
) -> None:
    from tests.cluster import running
    from tests.gui.driver import SERVER, connect

    w = open_window()
    w.chat.link.interval = 0.2  # probe often: the test waits on what the window shows
    with running(str(tiny_model), 1, tmp_path) as server:
        connect(qtbot, w, server.url)
        qtbot.waitUntil(lambda: w.chat.link.server is not None and w.chat.link.ready, timeout=SERVER)
        server.stop()
        server.wait_exit()
        qtbot.waitUntil(lambda: w.chat.link.server is not None and not w.chat.link.server.up, timeout=SERVER)
    assert "What you type is kept" in w.banner.text()
    w.composer.setFocus()
    qtbot.keyClicks(w.composer, "typed while the server is away")
    assert not w.composer.isReadOnly() and w.composer.toPlainText() == "typed while the server is away"
    assert not w.reply_bar.send_button.isEnabled() and "not reachable" in w.reply_bar.send_button.toolTip()
    qtbot.keyClick(w.composer, Qt.Key.Key_Return)  # Enter: not sent, the text stays
    assert not w.chat.generation.busy and w.chat.conversation.vms == [] and w.composer.toPlainText() == "typed while the server is away"


def test_a_send_the_unreachable_server_stopped_says_why_whole_and_the_stale_cold_run_error_goes(
    qtbot: Any, open_window: Callable[..., MainWindow], tiny_model: Path, tmp_path: Path
) -> None:
    from tests.cluster import running
    from tests.gui.driver import SERVER, connect

    w = open_window(max_tokens=4)
    w.resize(1200, 800)
    w.debug_panel.show()
    w.chat.link.interval = 0.2  # probe often: the test waits on what the window shows
    with running(str(tiny_model), 1, tmp_path) as server:
        connect(qtbot, w, server.url)
        qtbot.waitUntil(lambda: w.chat.link.server is not None and w.chat.link.ready, timeout=SERVER)
        send(qtbot, w, "Why is the sky blue?")
        qtbot.waitUntil(lambda: not w.chat.generation.busy, timeout=SERVER)
        reply = replies(w)[-1]
        server.stop()
        server.wait_exit()
        qtbot.waitUntil(lambda: w.chat.link.server is not None and not w.chat.link.server.up, timeout=SERVER)
        # 8d: a Verify while it is away fails, and says so in the debug panel ...
        w.chat.conversation.select(reply.id)
        w.debug_panel.verify_button.click()
        qtbot.waitUntil(lambda: w.debug_panel.value("verify").startswith("failed: "), timeout=SERVER)
        # 6: Enter on a draft: not sent, and why, whole, where it stays (the status bar elides it).
        w.composer.setPlainText("typed while the server is away")
        w.reply_bar.send()
        notice = w.notice.label
        qtbot.waitUntil(lambda: notice.text().startswith("Not sent: ") and _whole(notice), timeout=LONG)
        assert w.chat.link.server.error in notice.text() and "What you typed is kept." in notice.text()
        server.start(same_port=True)
        qtbot.waitUntil(lambda: w.chat.link.server is not None and w.chat.link.server.up, timeout=SERVER)
        # ... and once the server answers again, neither stale explanation is left in view.
        assert w.debug_panel.value("verify") == "–"
        assert not w.notice.isVisibleTo(w)


# -- 8c. one model label, attached to a server ---------------------------------------------------------
def test_attached_to_a_server_every_reply_has_one_model_label_and_a_regenerate_keeps_it(
    qtbot: Any, open_window: Callable[..., MainWindow], tmp_path: Path
) -> None:
    from engine.models.resolve import DEMO_NAME
    from tests.cluster import running
    from tests.gui.driver import SERVER, connect

    w = open_window(model="demo", max_tokens=4)  # the demo, as a new user has it
    send(qtbot, w, "Why is the sky blue?")  # made here
    here = replies(w)[-1]
    assert here.model_name == DEMO_NAME
    w.chat.link.interval = 0.2
    with running("demo", 1, tmp_path) as server:  # the same model, served: its id there is "demo"
        connect(qtbot, w, server.url)
        qtbot.waitUntil(lambda: w.chat.link.server is not None and w.chat.link.ready, timeout=SERVER)
        send(qtbot, w, "And the sunset?", wait=False)  # made on the server
        qtbot.waitUntil(lambda: not w.chat.generation.busy, timeout=SERVER)
        assert [vm.model_name for vm in replies(w)] == [DEMO_NAME, DEMO_NAME]
        shown: list[str] = []
        w.chat.generation.streamed.connect(lambda *a: shown.append(w.chat_view.widget_for(w.chat.generation.pending.reply_id)
                                                             .role_label.text()))
        w.chat.conversation.select(here.id)
        ops.regenerate(w.chat, fresh=False)  # the first reply, again, on the server
        shown.append(w.chat_view.widget_for(w.chat.generation.pending.reply_id).role_label.text())
        qtbot.waitUntil(lambda: not w.chat.generation.busy, timeout=SERVER)
        widget = w.chat_view.widget_for(w.chat.conversation.selected.id)  # the reply again (or its new variant)
        assert set(shown) == {DEMO_NAME} and widget.role_label.text() == DEMO_NAME  # the header never flips


# -- 14. attached to a server: its chunk size, the window's memory; docs name real files -------
def test_on_a_server_replies_record_its_chunk_size_and_the_memory_figure_says_whose(
    qtbot: Any, open_window: Callable[..., MainWindow], tiny_model: Path, tmp_path: Path  # noqa: F811
) -> None:
    import re

    from tests.gui.driver import SERVER, connect
    from tests.cluster import running

    w = open_window(chunk=16)
    assert re.fullmatch(r"Memory \d+(\.\d+)? [KMG]B \(MLX \d+(\.\d+)? [KMG]?B\)", w.models.memory_label.text())
    with running(str(tiny_model), 1, tmp_path, "--chunk", "24") as server:
        connect(qtbot, w, server.url)
        qtbot.waitUntil(lambda: w.chat.link.server is not None and w.chat.link.ready, timeout=SERVER)
        assert w.models.memory_label.text().startswith("This window ") and "on the server" in w.models.memory_label.text()
        send(qtbot, w, "Why is the sky blue? " * 4, wait=False)
        qtbot.waitUntil(lambda: not w.chat.generation.busy, timeout=SERVER)
        done = watch(w).finished
        assert done.result.report.chunk_size == 24  # the server prefills in its own chunks
        assert done.pending.chunk == 24  # and a partial save or a receipt names them, not the window's 16
        receipt = w.session.receipt(done.pending.reply_id, w.chat.link.identity())
        assert receipt.to_dict()["chunk"] == 24


# -- 9. attached to a server: the cache-store rows say what they hold; no Clear cache ----------
def test_on_a_server_the_cache_store_rows_name_what_they_hold_and_clear_cache_is_gone(
    qtbot: Any, open_window: Callable[..., MainWindow], tiny_model: Path, tmp_path: Path  # noqa: F811
) -> None:
    from tests.cluster import running
    from tests.gui.driver import SERVER, connect

    w = open_window()
    w.debug_panel.show()
    keys = w.debug_panel.store_keys
    assert keys["memory"].text() == "Memory" and w.debug_panel.clear_button.isVisible()
    with running(str(tiny_model), 1, tmp_path) as server:
        connect(qtbot, w, server.url)
        qtbot.waitUntil(lambda: w.chat.link.server is not None and w.chat.link.ready, timeout=SERVER)
        qtbot.waitUntil(lambda: "remote" in w.chat.link.stats, timeout=SERVER)
        address = w.debug_panel.value("memory")
        assert address.endswith(f"127.0.0.1:{server.port}")  # the row holding the address says so:
        assert keys["memory"].text() == "Server" and "Memory" not in [k.text() for k in keys.values()]
        assert w.debug_panel.store_box.title() == "Cache store (on the server)"
        assert not w.debug_panel.clear_button.isVisible() and not w.debug_panel.clear_button.isEnabled()
        w.models.disconnect_action.trigger()
        qtbot.waitUntil(lambda: w.chat.link.server is None and w.chat.link.ready, timeout=LONG)
        qtbot.waitUntil(lambda: "remote" not in w.chat.link.stats, timeout=LONG)
    assert keys["memory"].text() == "Memory" and w.debug_panel.clear_button.isVisible()
    assert w.debug_panel.clear_button.isEnabled()


def test_a_regenerate_on_another_number_of_ranks_names_the_world_size_as_the_cause(
    tiny_model: Path, tmp_path: Path
) -> None:
    """The real first reply and its real regenerate (tiny model); the regenerate's report as a
    2-rank server's would say (world size 2), its logprobs one ulp away (another summation order)."""
    import dataclasses

    from app.core.store import ChatSettings
    from app.core.store.session import ChatSession
    from app.core.store import ConversationStore
    from app.core.conversation.model import read_path
    from app.core.conversation.view_models import debug_vm
    from engine.engine import Engine
    from engine.types import SamplerSettings
    from tests.engine_helpers import flip_low_bit

    store = ConversationStore(tmp_path / "db.sqlite3")
    engine = Engine(use_disk=False, chunk=16)
    engine.load(str(tiny_model))
    try:
        session = ChatSession(store)
        conv = session.new_conversation(ChatSettings(sampler=SamplerSettings(max_tokens=8, seed=3), random_seed=False))
        first = session.finish(p1 := session.begin_send(conv, "Why is the sky blue?"), engine.generate(p1.request)).message
        p2 = session.begin_regenerate(first.id)
        result = engine.generate(p2.request)
        lps = list(result.logprobs)
        lps[2] = flip_low_bit(lps[2])
        report = dataclasses.replace(result.report, world_size=2)
        session.finish(p2, dataclasses.replace(result, logprobs=lps, report=report))
        vm = read_path(session, conv)[-1]
        assert vm.identity.startswith("same tokens, logprobs differ by ") and vm.identity.endswith(
            " (on 2 ranks, the previous on 1 rank)")
        assert "another world size sums the layers in another order" in debug_vm(vm).rows["identity"]
        store.close()
        again = ChatSession(ConversationStore(tmp_path / "db.sqlite3"))  # read back: the same words
        assert read_path(again, conv)[-1].identity == vm.identity
        again.close()
    finally:
        engine.close()


def test_the_connect_dialog_names_this_computer_as_it_is(qtbot: Any) -> None:
    import sys

    from PySide6.QtWidgets import QLabel

    from app.qt.engine_link.server_dialog import ServerDialog

    dlg = ServerDialog()
    qtbot.addWidget(dlg)
    intro = " ".join(label.text() for label in dlg.findChildren(QLabel))
    expected = "this Mac." if sys.platform == "darwin" else "this computer."
    assert f"Conversations stay on {expected}" in intro and ("this Mac" in intro) == (sys.platform == "darwin")
