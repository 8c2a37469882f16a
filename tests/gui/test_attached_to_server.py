"""The window attached to a Verbatim server on 2 ranks (tiny llama, ring backend on localhost):
Models -> Connect, send, regenerate identical and marked so, the debug panel's row per rank,
verify against a cold run on the server; the server stopped -> the window says so and keeps
what is typed; the server back -> the window works again, its cache from disk."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtCore import QSettings, Qt  # noqa: E402
from PySide6.QtGui import QAction  # noqa: E402

from app.qt.engine_link.server_dialog import ServerDialog  # noqa: E402
from app.qt.window.window import MainWindow  # noqa: E402
from engine.remote import RemoteEngine  # noqa: E402
from tests.cluster import Cluster, running  # noqa: E402
from tests.file_keyring import FileKeyring  # noqa: E402
from tests.gui.driver import (  # noqa: E402
    CTRL, LONG, ROOT, SERVER, connect, no_reply_ends, replies, send, settings, wait_compared, watch,
)

pytestmark = pytest.mark.gui






def test_the_window_attached_to_a_two_rank_server(
    qtbot: Any, open_window: Callable[..., MainWindow], cluster: Cluster, tmp_path: Path  # noqa: F811
) -> None:
    w = open_window()  # the tiny model in process first
    w.chat.link.interval = 0.2  # probe often: the test waits on what the window shows
    connect(qtbot, w, cluster.url)
    qtbot.waitUntil(lambda: w.chat.link.server is not None and w.chat.link.ready, timeout=SERVER)
    served = cluster.get("/verbatim/model")
    where = f"{Path(served['id']).name} · 2 ranks at 127.0.0.1:{cluster.port}"
    assert w.models.model_label.text() == where and w.chat.link.info.key == served["key"]
    assert w.qsettings.value("server/url") == cluster.url and w.qsettings.value("model/last") == cluster.url
    assert w.findChild(QAction, "disconnectServerAction").isEnabled()
    assert not w.debug_panel.clear_button.isEnabled()  # the server's cache is the server's

    send(qtbot, w, "Why is the sky blue?", wait=False)
    qtbot.waitUntil(lambda: not w.chat.generation.busy, timeout=SERVER)
    first = watch(w).finished.result
    reply = replies(w)[-1]
    reply_conv = w.chat.conversation.conv_id
    n = first.report.prompt_tokens
    stored = w.session.store.get_message(reply.id)
    assert len(first.tokens) == 24 and stored.tokens == first.tokens and stored.logprobs == first.logprobs
    assert first.report.world_size == 2 and first.report.restored == 0

    # The meter counts the next prompt with the server's tokenizer, against the served context.
    w.composer.setPlainText("And why are sunsets red?")
    qtbot.waitUntil(lambda: w.chat.composer.budget is not None and w.chat.composer.budget.draft > 0, timeout=SERVER)
    budget = w.chat.composer.budget
    turns = [{"role": vm.role, "content": vm.content} for vm in w.chat.conversation.vms]
    expected = RemoteEngine(cluster.url).prompt_ids(turns + [{"role": "user", "content": "And why are sunsets red?"}])
    assert budget.limit == served["context_length"] and budget.used == len(expected)
    assert w.context_meter.label.text() == f"{budget.used:,} / {budget.limit:,}"
    w.composer.clear()

    # Regenerate (Ctrl+R): the same tokens and bits from the server's cache, marked identical.
    before = watch(w).finished
    qtbot.keyClick(w, Qt.Key.Key_R, CTRL)
    qtbot.waitUntil(lambda: watch(w).finished is not before, timeout=SERVER)
    again = watch(w).finished
    assert again.result.tokens == first.tokens and again.result.logprobs == first.logprobs
    assert again.result.report.restored == n - 1 and again.result.report.source == "memory"
    assert again.saved.duplicate_of == reply.id and [vm.id for vm in replies(w)] == [reply.id]
    widget = w.chat_view.widget_for(reply.id)
    assert widget.identity.text().startswith("✓ identical") and widget.footer.text().startswith("run 2 of 2")

    # The debug panel: a row per rank, each restored n-1 with every layer there.
    w.menus.debug_action.trigger()
    assert w.debug_panel.rank_box.isVisible()
    assert w.debug_panel.rank_box.title() == "Ranks (2)"
    lines = w.debug_panel.ranks.text().splitlines()
    hosts = [r["host"] for r in again.result.report.ranks]
    assert lines == [f"rank {k} ({hosts[k]}): restored {n - 1} from memory · stored "
                     f"{again.result.report.ranks[k]['stored']} · layers all 4 at {n - 1} · no declines"
                     for k in (0, 1)]
    assert w.debug_panel.value("entries") == "on the server" and w.debug_panel.value("memory") == cluster.url
    # The server's report is whole: the prefill forward, the layers, the context (not guesses).
    assert w.debug_panel.value("chunks").startswith(f"1 forward: [{n - 1}, {n})")
    assert w.debug_panel.layers.rowCount() == 4 and w.debug_panel.layers.item(0, 2).text() == str(n - 1)
    assert w.debug_panel.value("context").startswith(f"{n} of {served['context_length']:,}")

    # Compare: the reply against a cold run on the server, token texts from the server's tokenizer.
    data = wait_compared(qtbot, w, lambda: qtbot.mouseClick(widget.compare_button, Qt.MouseButton.LeftButton),
                         timeout=SERVER)
    assert data.a.message_id == reply.id and data.a.pieces is not None and "".join(data.a.pieces) == first.text
    cold = wait_compared(qtbot, w, lambda: qtbot.mouseClick(w.inspector.view.cold_button, Qt.MouseButton.LeftButton),
                         timeout=SERVER)
    assert cold.comparison.identical and cold.b.tokens == first.tokens and cold.b.source is None
    w.inspector.view.close()

    # Verify against a cold run: the server runs it with no cache.
    qtbot.mouseClick(w.debug_panel.verify_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.chat.cold_runs.verifying, timeout=SERVER)
    assert w.debug_panel.value("verify").startswith("✓ identical")

    # A receipt of the reply names the server: `python -m engine verify` replays it there.
    path = tmp_path / "reply.receipt.json"
    assert w.inspector.export_receipt(reply.id, str(path)) == str(path)
    receipt = json.loads(path.read_text())
    assert receipt["model"]["spec"] == cluster.url and receipt["environment"] == served["environment"]
    proc = subprocess.run([sys.executable, "-m", "engine", "verify", str(path)], capture_output=True, text=True,
                          timeout=SERVER / 1000, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "replaying on" in proc.stderr and "2 ranks" in proc.stderr and "environment differs" not in proc.stdout

    # Stop mid-reply: the reply keeps what it has, its token ids too (the stream names them).
    w.conversations.new()
    w.settings.apply(settings(max_tokens=3000, logit_bias=no_reply_ends(Path(cluster.model))))  # no early end
    shown: list[str] = []  # the debug panel's title as the server's stream advanced the run
    w.chat.generation.live_changed.connect(lambda live: shown.append(w.debug_panel.title.text()) if live else None)
    send(qtbot, w, "Tell me a long story.", wait=False)
    qtbot.waitUntil(lambda: w.chat.generation.stream.tokens >= 3 or not w.chat.generation.busy, timeout=SERVER)
    assert w.chat.generation.busy, "the reply ended before it could be stopped"
    qtbot.mouseClick(w.reply_bar.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.chat.generation.busy, timeout=SERVER)
    stopped = w.session.store.get_message(replies(w)[-1].id)
    assert stopped.status == "interrupted" and 3 <= len(stopped.tokens) < 3000
    assert len(stopped.logprobs) == len(stopped.tokens) and all(t >= 0 for t in stopped.tokens)
    # While it ran, the panel showed the server's restore and prefill (verbatim.progress), not a
    # blank; stopped, its report states the forwards the server made and the seed it used.
    assert any(" · in progress: prefill" in t for t in shown), shown
    r = stopped.report
    assert r.seed == stopped.seed and r.prefill_tokens == sum(b - a for a, b in r.chunks) > 0
    assert w.debug_panel.memory_box.title() == "Memory (on the server)"
    assert w.debug_panel.process_memory.text() == "The memory that matters is the server's, in its own process."
    w.settings.apply(settings())
    w.conversations.show(reply_conv)
    assert w.chat.conversation.selected.id == reply.id

    # The server stops: the window says so; what is typed stays, and Enter sends nothing.
    assert cluster.stop() == [0, 0], cluster.log()
    draft = "A question typed while the server is away"
    w.composer.setPlainText(draft)
    qtbot.waitUntil(lambda: "not reachable" in w.models.model_label.text(), timeout=SERVER)
    assert w.banner.isVisible() and "The server is not reachable" in w.banner.text()
    assert not w.reply_bar.send_button.isEnabled() and not w.reply_bar.regenerate_button.isEnabled()
    w.composer.setFocus()
    qtbot.keyClick(w.composer, Qt.Key.Key_Return)
    assert not w.chat.generation.busy and w.composer.toPlainText() == draft
    assert [vm.role for vm in w.chat.conversation.vms] == ["user", "assistant"]  # nothing was sent

    # It comes back where it was (its cache on disk): the window works again by itself.
    cluster.start(same_port=True)
    qtbot.waitUntil(lambda: w.chat.link.server.up, timeout=SERVER)
    assert w.models.model_label.text() == where and not w.banner.isVisible() and w.reply_bar.send_button.isEnabled()
    assert w.composer.toPlainText() == draft
    before = watch(w).finished
    w.activateWindow()
    qtbot.waitUntil(w.isActiveWindow, timeout=LONG)
    qtbot.keyClick(w, Qt.Key.Key_R, CTRL)
    qtbot.waitUntil(lambda: watch(w).finished is not before, timeout=SERVER)
    after = watch(w).finished.result
    assert after.tokens == first.tokens and after.logprobs == first.logprobs
    assert after.report.restored == n - 1 and after.report.source == "disk"
    assert [line.split(" · ")[0].endswith(f"restored {n - 1} from disk")
            for line in w.debug_panel.ranks.text().splitlines()] == [True, True]

    # Back to a model in this process: the local engine again, the same tokens as the server's
    # would not be promised (world size is part of the identity), but a reply comes.
    w.findChild(QAction, "disconnectServerAction").trigger()
    qtbot.waitUntil(lambda: w.chat.link.server is None and w.chat.link.ready, timeout=LONG)
    assert "ranks" not in w.models.model_label.text() and w.debug_panel.clear_button.isEnabled()


def test_a_server_that_cannot_be_reached_keeps_the_model_loaded(
    qtbot: Any, open_window: Callable[..., MainWindow]  # noqa: F811
) -> None:
    from tests.cluster import free_ports

    w = open_window()
    before = w.chat.link.info
    connect(qtbot, w, f"127.0.0.1:{free_ports(1)[0]}")  # nothing listens there
    qtbot.waitUntil(lambda: bool(watch(w).errors), timeout=LONG)
    title, text = watch(w).errors[-1]
    assert title == "Cannot connect to the server" and text.startswith("Cannot reach the server")  # a sentence
    assert w.chat.link.server is None and w.chat.link.ready and w.chat.link.info is before
    errors = len(watch(w).errors)
    send(qtbot, w, "Still here?")  # the model loaded before still answers
    assert len(watch(w).errors) == errors, watch(w).errors[-1]
    assert [(vm.role, vm.status) for vm in w.chat.conversation.vms] == [("user", "complete"), ("assistant", "complete")]


def test_a_remembered_server_gone_at_start_falls_back_to_the_last_model_here(
    qtbot: Any, open_window: Callable[..., MainWindow], tiny_model: Path, tmp_path: Path  # noqa: F811
) -> None:
    from tests.cluster import free_ports

    data = tmp_path / "data"
    open_window(data_dir=data).close()  # the tiny model was the last one used here
    w = open_window(data_dir=data, model=f"http://127.0.0.1:{free_ports(1)[0]}", wait=False)
    qtbot.waitUntil(lambda: w.chat.link.ready, timeout=LONG)
    title, text = watch(w).errors[-1]
    assert title == "Cannot connect to the server" and text.startswith("Cannot reach the server")  # a sentence
    assert f"Using {tiny_model.name} on this computer instead" in text
    assert w.chat.link.server is None and w.chat.link.spec == str(tiny_model) and w.models.model_label.text() == tiny_model.name
    send(qtbot, w, "Still here?")
    assert replies(w)[-1].status == "complete"


def test_a_server_with_a_key_is_remembered_and_attached_again_at_the_next_start(
    qtbot: Any, open_window: Callable[..., MainWindow], tiny_model: Path, tmp_path: Path,  # noqa: F811
    file_keyring: FileKeyring,
) -> None:
    """The key is remembered in the keyring (a file-backed one here), never in settings.ini;
    the next start attaches with it; a key an older version left in settings.ini moves to the
    keyring at the next start, and the window attaches with it."""
    with running(str(tiny_model), 1, tmp_path, "--api-key", "s3cret") as server:
        data = tmp_path / "data"
        ini = data / "settings.ini"
        w = open_window(data_dir=data)
        connect(qtbot, w, server.url)  # no key: refused, the local model stays
        qtbot.waitUntil(lambda: bool(watch(w).errors), timeout=SERVER)
        assert "missing or wrong API key" in watch(w).errors[-1][1] and w.chat.link.server is None and w.chat.link.ready
        w.findChild(QAction, "connectServerAction").trigger()
        dlg = next(d for d in w.findChildren(ServerDialog, "serverDialog") if d.isVisible())
        assert dlg.remember.text() == "Remember the key (kept in the system keyring)"  # not "not encrypted"
        dlg.reject()
        # What to do in this window, not the header an HTTP client sends.
        assert "Authorization" not in watch(w).errors[-1][1] and "Models → Connect" in watch(w).errors[-1][1]
        connect(qtbot, w, server.url, key="s3cret", remember=True)
        qtbot.waitUntil(lambda: w.chat.link.server is not None and w.chat.link.ready, timeout=SERVER)
        assert w.models.model_label.text().endswith(f"1 process at 127.0.0.1:{server.port}")
        w.qsettings.sync()
        assert "s3cret" not in ini.read_text(encoding="utf-8")
        assert file_keyring.items() == {"Verbatim": {server.url: "s3cret"}}
        send(qtbot, w, "Why is the sky blue?", wait=False)
        qtbot.waitUntil(lambda: not w.chat.generation.busy, timeout=SERVER)
        first = watch(w).finished.result
        w.close()

        again = open_window(data_dir=data, model=str(w.qsettings.value("model/last")))
        again.chat.link.interval = 0.2
        assert again.chat.link.server is not None and again.chat.link.server.api_key == "s3cret"
        assert again.models.model_label.text() == w.models.model_label.text()
        before = watch(again).finished
        qtbot.keyClick(again, Qt.Key.Key_R, CTRL)
        qtbot.waitUntil(lambda: watch(again).finished is not before, timeout=SERVER)
        result = watch(again).finished.result
        assert result.tokens == first.tokens and result.logprobs == first.logprobs
        assert result.report.restored == result.report.prompt_tokens - 1
        again.close()

        # An older version's settings.ini, the key in plain text; the keyring has none.
        old = QSettings(str(ini), QSettings.Format.IniFormat)
        old.setValue("server/key", "s3cret")
        old.sync()
        file_keyring.delete_password("Verbatim", server.url)
        third = open_window(data_dir=data, model=server.url)
        assert third.chat.link.server is not None and third.chat.link.server.api_key == "s3cret"
        assert "s3cret" not in ini.read_text(encoding="utf-8")
        assert file_keyring.items() == {"Verbatim": {server.url: "s3cret"}}
