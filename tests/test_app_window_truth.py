"""What a new user hits (issue 28), each as the window shows it (pytest-qt, offscreen, tiny real
model): a send the meter refuses is disabled and never touches the conversation, the composer
stays editable while the server is away, drafts survive a restart, one selected run drives
the footer and the debug panel, and the rest of the list."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402

from app.core import ops  # noqa: E402
from app.qt.window import MainWindow  # noqa: E402
from tests.app_helpers import watch  # noqa: E402
from tests.test_app_window import LONG, open_window, replies, send, wait_idle  # noqa: E402,F401 (a fixture)

pytestmark = pytest.mark.gui
TURN = "Tell me more about the colours of the evening sky over the sea, please. " * 3  # ~50 tokens


def path_of(w: MainWindow) -> list[tuple[int, str, str]]:
    return [(vm.id, vm.role, vm.content) for vm in w.chat.vms]


# -- 4. a draft too long for the context --------------------------------------------------------
def test_a_send_the_meter_refuses_is_disabled_and_never_touches_the_conversation(
    qtbot: Any, open_window: Callable[..., MainWindow]  # noqa: F811
) -> None:
    w = open_window(max_tokens=8, temperature=0.0)
    send(qtbot, w, "Hello there.")
    limit = 120  # this conversation's own limit; the model's is larger
    w.apply_settings(replace(w.current_settings(), context_length=limit), as_default=False)
    before = path_of(w)
    draft = TURN * 3  # ~150 tokens alone: no turn left out can make room
    w.composer.setPlainText(draft)
    qtbot.waitUntil(lambda: "Send will be refused" in w.context_meter.warning.text(), timeout=LONG)
    assert not w.send_button.isEnabled()
    assert w.send_button.toolTip() == w.context_meter.warning.text()
    qtbot.keyClick(w.composer, Qt.Key.Key_Return)  # Enter: refused as the button is
    assert not w.chat.generating and path_of(w) == before and w.composer.toPlainText() == draft
    # Typed and sent before the meter counted it: the engine refuses, the send is taken back.
    again = draft + " And the stars?"
    w.composer.setPlainText(again)
    assert w.send_button.isEnabled()  # not counted yet: the meter does not know
    qtbot.mouseClick(w.send_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: bool(watch(w).errors), timeout=LONG)
    wait_idle(qtbot, w)
    assert path_of(w) == before and w.composer.toPlainText() == again
    title, text = watch(w).errors[-1]
    assert title == "Not sent" and f"this conversation's {limit:,}-token context limit" in text
    model = w.chat.model_info.context_length
    assert f"the model's own is {model:,}" in text and "model's context is" not in text


def test_a_refused_first_message_makes_no_conversation(
    qtbot: Any, open_window: Callable[..., MainWindow]  # noqa: F811
) -> None:
    w = open_window(max_tokens=8, temperature=0.0, context_length=100)  # the model's own context
    send(qtbot, w, "Hello there.")
    w.new_conversation()
    chats = w.sidebar.list.count()
    w.composer.setPlainText(TURN * 3)
    qtbot.mouseClick(w.send_button, Qt.MouseButton.LeftButton)  # before the count: the engine refuses
    qtbot.waitUntil(lambda: bool(watch(w).errors), timeout=LONG)
    wait_idle(qtbot, w)
    assert w.conv_id is None and w.chat.vms == [] and w.sidebar.list.count() == chats
    assert len(w.session.store.list_conversations()) == chats
    assert w.composer.toPlainText() == TURN * 3
    assert "the model's 100-token context" in watch(w).errors[-1][1]


# -- 1. typing while the server is away -----------------------------------------------------------
def test_the_composer_stays_editable_and_send_waits_while_the_server_is_away(
    qtbot: Any, open_window: Callable[..., MainWindow], tiny_model: Path, tmp_path: Path  # noqa: F811
) -> None:
    from tests.cluster import running
    from tests.test_app_remote import SERVER, connect

    w = open_window()
    w.chat.link_interval = 0.2  # probe often: the test waits on what the window shows
    with running(str(tiny_model), 1, tmp_path) as server:
        connect(qtbot, w, server.url)
        qtbot.waitUntil(lambda: w.chat.link is not None and w.chat.model_ready, timeout=SERVER)
        server.stop()
        server.wait_exit()
        qtbot.waitUntil(lambda: w.chat.link is not None and not w.chat.link.up, timeout=SERVER)
    assert "What you type is kept" in w.banner.text()
    w.composer.setFocus()
    qtbot.keyClicks(w.composer, "typed while the server is away")
    assert not w.composer.isReadOnly() and w.composer.toPlainText() == "typed while the server is away"
    assert not w.send_button.isEnabled() and "not reachable" in w.send_button.toolTip()
    qtbot.keyClick(w.composer, Qt.Key.Key_Return)  # Enter: not sent, the text stays
    assert not w.chat.generating and w.chat.vms == [] and w.composer.toPlainText() == "typed while the server is away"


# -- 5. drafts survive quitting ----------------------------------------------------------------
def test_drafts_are_stored_with_their_conversation_and_restored_at_start(
    qtbot: Any, open_window: Callable[..., MainWindow], tmp_path: Path  # noqa: F811
) -> None:
    data = tmp_path / "data"
    w = open_window(data_dir=data, max_tokens=4)
    send(qtbot, w, "first chat")
    first = w.conv_id
    w.new_conversation()
    send(qtbot, w, "second chat")
    second = w.conv_id
    qtbot.keyClicks(w.composer, "a draft for the second")
    w.sidebar.list.setCurrentRow(w.sidebar.ids().index(first))
    qtbot.keyClicks(w.composer, "a draft for the first")
    w.close()  # right away: the draft being typed is saved at close
    again = open_window(data_dir=data, max_tokens=4)
    assert again.conv_id == second and again.composer.toPlainText() == "a draft for the second"
    again.sidebar.list.setCurrentRow(again.sidebar.ids().index(first))
    assert again.composer.toPlainText() == "a draft for the first"
    send(qtbot, again, "sent now")  # sent: no longer a draft, after a restart either
    again.close()
    third = open_window(data_dir=data, max_tokens=4)
    assert third.conv_id == first and third.composer.toPlainText() == ""
    third.sidebar.list.setCurrentRow(third.sidebar.ids().index(second))
    assert third.composer.toPlainText() == "a draft for the second"


# -- 3. one selected run drives the footer and the debug panel ---------------------------------
def test_the_run_picked_in_the_runs_menu_is_the_one_the_footer_badge_and_debug_panel_show(
    qtbot: Any, open_window: Callable[..., MainWindow]  # noqa: F811
) -> None:
    w = open_window()
    send(qtbot, w, "Explain how a prompt cache works in two sentences.")
    reply = replies(w)[-1]
    first = watch(w).finished.result.report
    for _ in range(2):
        ops.regenerate(w.chat, fresh=False)
        wait_idle(qtbot, w)
    assert replies(w)[-1].id == reply.id  # identical: three runs of one reply
    w.debug_panel.show()
    widget = w.chat_view.widget_for(reply.id)
    assert "run 3 of 3" in w.debug_panel.title.text() and widget.identity.isVisible()
    runs = widget.runs_button.menu().actions()
    runs[0].trigger()
    widget = w.chat_view.widget_for(reply.id)
    qtbot.mouseClick(widget.body, Qt.MouseButton.LeftButton)  # a click on the reply: the same run stays
    assert widget.footer.text().startswith("run 1 of 3 · ") and f"restored 0 / {first.prompt_tokens}" in widget.footer.text()
    assert "run 1 of 3" in w.debug_panel.title.text()
    assert w.debug_panel.value("restored").startswith("0 / ")
    assert not widget.identity.isVisible()  # the original run is compared with nothing
    assert [a.isChecked() for a in widget.runs_button.menu().actions()] == [True, False, False]
    ops.regenerate(w.chat, fresh=False)  # a new run: the latest is shown again
    wait_idle(qtbot, w)
    widget = w.chat_view.widget_for(reply.id)
    assert widget.footer.text().startswith("run 4 of 4 · ") and "run 4 of 4" in w.debug_panel.title.text()


# -- 12. closing while a search waits -------------------------------------------------------------
def test_a_search_typed_just_before_closing_never_reaches_the_closed_store(
    qtbot: Any, open_window: Callable[..., MainWindow]  # noqa: F811
) -> None:
    w = open_window(max_tokens=4)
    send(qtbot, w, "fruit salad")
    qtbot.keyClicks(w.sidebar.search, "fruit")  # debounced: the search starts once typing pauses
    w.close()  # the store closes with the window
    qtbot.waitUntil(lambda: not w.sidebar._debounce.isActive(), timeout=LONG)
    w.sidebar.search.setText("")  # a late change (Qt clears a field as it goes): nothing runs
    w.sidebar.searchChanged.emit("fruit")
    w.refresh_conversations()  # pytest-qt fails the test on an exception raised in any of these
    assert w.engine_closed and w.windowTitle() == "fruit salad — Verbatim"


# -- 2. Compare shows this comparison, and reuses Verify's cold run -------------------------------
def test_compare_never_shows_another_comparison_and_reuses_the_cold_run_verify_made(
    qtbot: Any, open_window: Callable[..., MainWindow], monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    from engine.engine import Engine
    from tests.app_helpers import wait_compared

    cold_runs: list[int] = []  # prompts run cold (on the engine thread)
    real = Engine.cold_run

    def counted(self: Engine, request: Any, cancel: Any = None) -> Any:
        result = real(self, request, cancel)
        cold_runs.append(result.report.prompt_tokens)
        return result

    monkeypatch.setattr(Engine, "cold_run", counted)
    w = open_window()
    send(qtbot, w, "Why is the sky blue? " * 8)
    earlier = wait_compared(qtbot, w, lambda: w.inspector.open_compare(replies(w)[-1].id))  # B: a cold run
    assert len(cold_runs) == 1 and w.inspector.view.data is earlier
    w.new_conversation()
    send(qtbot, w, "Hi.")
    reply = replies(w)[-1]
    w.debug_panel.show()
    qtbot.mouseClick(w.debug_panel.verify_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.chat.verifying, timeout=LONG)
    assert w.debug_panel.value("verify").startswith("✓ identical") and len(cold_runs) == 2
    view = w.inspector.open_compare(reply.id)
    # At once: nothing of the earlier conversation's comparison is on screen.
    assert view.data is None and view.side_a.text() == "" and view.model.rowCount() == 0
    data = wait_compared(qtbot, w, lambda: None)
    assert data.a.tokens == w.session.store.get_message(reply.id).tokens == data.b.tokens
    assert len(cold_runs) == 2  # Verify's cold run is B: not run again
    assert "cold run of" in view.side_b.text() and data.comparison.identical


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
    first = w.conv_id
    hit_id = next(vm.id for vm in w.chat.vms if "Danube" in vm.content)
    w.new_conversation()
    send(qtbot, w, "something else")
    w.sidebar.search.setText("danube")
    qtbot.waitUntil(lambda: w.sidebar.ids() == [first], timeout=LONG)
    w.sidebar.list.setCurrentRow(0)
    assert w.conv_id == first
    target = w.chat_view.widget_for(hit_id)
    assert target.property("flash") is True  # highlighted
    bar = w.chat_view.verticalScrollBar()
    vp = w.chat_view.viewport()

    def in_view() -> bool:
        return vp.rect().intersects(QRect(target.mapTo(vp, QPoint(0, 0)), target.size()))

    qtbot.waitUntil(lambda: w.chat_view.following is None, timeout=LONG)  # the layout settled:
    assert target.property("flash") is True  # still marked: until the next action
    assert in_view() and 0 < bar.value() < bar.maximum()  # the hit in view: not the top, not the bottom


# -- 10. a disabled menu item looks disabled -------------------------------------------------------
@pytest.mark.parametrize("theme", ["light", "dark"])
def test_a_disabled_menu_item_is_drawn_unlike_an_enabled_one(
    qtbot: Any, open_window: Callable[..., MainWindow], theme: str  # noqa: F811
) -> None:
    from PySide6.QtGui import QAction

    w = open_window(wait=False, theme=theme)
    menu = w.disconnect_action.associatedObjects()[0]  # the Models menu
    connect = w.findChild(QAction, "connectServerAction")
    assert not w.disconnect_action.isEnabled() and connect.isEnabled()  # not attached to a server
    menu.adjustSize()
    image = menu.grab().toImage()

    def ink(action: Any) -> int:
        """How far the item's darkest (light theme) or brightest (dark) pixel is from its background."""
        r = menu.actionGeometry(action)
        bg = image.pixelColor(r.left() + 2, r.top() + 2).lightness()
        return max(abs(image.pixelColor(x, y).lightness() - bg)
                   for x in range(r.left(), r.right()) for y in range(r.top(), r.bottom()))  # fmt: skip

    enabled, disabled = ink(connect), ink(w.disconnect_action)
    assert disabled < 0.75 * enabled, (enabled, disabled)


# -- 14. attached to a server: its chunk size, the window's memory; docs name real files -------
def test_on_a_server_replies_record_its_chunk_size_and_the_memory_figure_says_whose(
    qtbot: Any, open_window: Callable[..., MainWindow], tiny_model: Path, tmp_path: Path  # noqa: F811
) -> None:
    import re

    from tests.test_app_remote import SERVER, connect
    from tests.cluster import running

    w = open_window(chunk=16)
    assert re.fullmatch(r"Memory \d+(\.\d+)? [KMG]B \(MLX \d+(\.\d+)? [KMG]?B\)", w.memory_label.text())
    with running(str(tiny_model), 1, tmp_path, "--chunk", "24") as server:
        connect(qtbot, w, server.url)
        qtbot.waitUntil(lambda: w.chat.link is not None and w.chat.model_ready, timeout=SERVER)
        assert w.memory_label.text().startswith("This window ") and "on the server" in w.memory_label.text()
        send(qtbot, w, "Why is the sky blue? " * 4, wait=False)
        qtbot.waitUntil(lambda: not w.chat.generating, timeout=SERVER)
        done = watch(w).finished
        assert done.result.report.chunk_size == 24  # the server prefills in its own chunks
        assert done.pending.chunk == 24  # and a partial save or a receipt names them, not the window's 16
        receipt = w.session.receipt(done.pending.reply_id, w.inspector.model_identity())
        assert receipt.to_dict()["chunk"] == 24


def test_the_window_module_names_only_files_that_exist() -> None:
    import re

    import app.qt.window as window

    root = Path(window.__file__).resolve().parents[2]
    named = set(re.findall(r"app/[\w/]+\.py", window.__doc__ or ""))
    assert named and [p for p in sorted(named) if not (root / p).is_file()] == []


# -- 7. a stopped regenerate is compared as far as it got --------------------------------------
def test_a_stopped_regenerate_is_described_as_identical_as_far_as_it_got(
    qtbot: Any, open_window: Callable[..., MainWindow]  # noqa: F811
) -> None:
    w = open_window(max_tokens=2000, temperature=0.0)  # greedy: runs to the limit, never an early EOS
    send(qtbot, w, "Tell me a long story.", wait=False)
    qtbot.waitUntil(lambda: w.chat.stream.tokens > 40, timeout=LONG)
    ops.stop(w.chat)  # the first reply: stopped too, but longer than the regenerate will get
    wait_idle(qtbot, w)
    first = replies(w)[-1]
    ops.regenerate(w.chat, fresh=False)
    qtbot.waitUntil(lambda: w.chat.stream.tokens > 8, timeout=LONG)
    ops.stop(w.chat)
    wait_idle(qtbot, w)
    again = replies(w)[-1]
    stored = w.session.store.get_message(again.id)
    n = len(stored.tokens)
    assert again.id != first.id and stored.status == "interrupted" and 8 < n < len(w.session.store.get_message(first.id).tokens)
    w.debug_panel.show()
    identity = w.debug_panel.value("identity")
    assert identity == f"identical to previous as far as this one got ({n} tokens, bit-equal logprobs; it was stopped)"
    assert w.chat_view.widget_for(again.id).identity.text() == "✓ identical to previous as far as it got"
    w.new_conversation()  # read back from the store, the same words
    w.sidebar.list.setCurrentRow(0)
    w.chat.select(again.id)
    assert w.debug_panel.value("identity") == identity


# -- 9. attached to a server: the cache-store rows say what they hold; no Clear cache ----------
def test_on_a_server_the_cache_store_rows_name_what_they_hold_and_clear_cache_is_gone(
    qtbot: Any, open_window: Callable[..., MainWindow], tiny_model: Path, tmp_path: Path  # noqa: F811
) -> None:
    from tests.cluster import running
    from tests.test_app_remote import SERVER, connect

    w = open_window()
    w.debug_panel.show()
    keys = w.debug_panel.store_keys
    assert keys["memory"].text() == "Memory" and w.debug_panel.clear_button.isVisible()
    with running(str(tiny_model), 1, tmp_path) as server:
        connect(qtbot, w, server.url)
        qtbot.waitUntil(lambda: w.chat.link is not None and w.chat.model_ready, timeout=SERVER)
        qtbot.waitUntil(lambda: "remote" in w.chat.cache_stats, timeout=SERVER)
        address = w.debug_panel.value("memory")
        assert address.endswith(f"127.0.0.1:{server.port}")  # the row holding the address says so:
        assert keys["memory"].text() == "Server" and "Memory" not in [k.text() for k in keys.values()]
        assert w.debug_panel.store_box.title() == "Cache store (on the server)"
        assert not w.debug_panel.clear_button.isVisible() and not w.debug_panel.clear_button.isEnabled()
        w.disconnect_action.trigger()
        qtbot.waitUntil(lambda: w.chat.link is None and w.chat.model_ready, timeout=LONG)
        qtbot.waitUntil(lambda: "remote" not in w.chat.cache_stats, timeout=LONG)
    assert keys["memory"].text() == "Memory" and w.debug_panel.clear_button.isVisible()
    assert w.debug_panel.clear_button.isEnabled()


# -- 11. the wording that misled ------------------------------------------------------------------
def test_a_one_token_prefill_shows_no_rate_and_the_title_no_database_id() -> None:
    from app.core.view_models import debug_vm, message_vm, prefill_rate_text
    from app.core.store import Message, ReplyOutcome, Run
    from engine.types import CacheReport

    regen = CacheReport(prompt_tokens=85, restored=84, prefill_tokens=1, prefill_tps=1.6)
    cold = CacheReport(prompt_tokens=85, restored=0, prefill_tokens=85, prefill_tps=412.0)
    # Not "1.6 tok/s": no slow prefill; the reason there is no rate (issue 39), and the time it took.
    said = "no rate: 1 token run in 625 ms (84 restored), too few (under 16) to measure prefill speed"
    assert prefill_rate_text(regen) == said
    assert prefill_rate_text(cold) == "412.0 tok/s"
    m = Message(id=7, conversation_id=1, parent_id=6, role="assistant", content="hi", created_at=0.0, status="complete",
                tokens=[1, 2])
    vm = message_vm(m, [7], [Run(1, 7, 0.0, 1, "stop", 2, regen, ReplyOutcome())])
    d = debug_vm(vm)
    assert d.rows["prefill_tps"] == said and "#7" not in d.title


def test_the_meter_is_red_only_when_send_would_be_refused(qtbot: Any) -> None:
    from app.core.context_budget import ContextBudget
    from app.qt.widgets.context_meter import ContextMeter

    meter = ContextMeter()
    qtbot.addWidget(meter)
    meter.show_budget(ContextBudget(456, 430, 8, "truncate", 20))  # old turns left out: the send fits
    assert meter.property("full") is False and "leave the oldest turns out" in meter.warning.text()
    meter.show_budget(ContextBudget(456, 430, 8, "refuse", 20))
    assert meter.property("full") is True and "Send will be refused" in meter.warning.text()


def test_the_connect_dialog_names_this_computer_as_it_is(qtbot: Any) -> None:
    import sys

    from PySide6.QtWidgets import QLabel

    from app.qt.widgets.server_dialog import ServerDialog

    dlg = ServerDialog()
    qtbot.addWidget(dlg)
    intro = " ".join(label.text() for label in dlg.findChildren(QLabel))
    expected = "this Mac." if sys.platform == "darwin" else "this computer."
    assert f"Conversations stay on {expected}" in intro and ("this Mac" in intro) == (sys.platform == "darwin")


def test_a_conversation_context_limit_does_not_carry_into_new_chats(
    qtbot: Any, open_window: Callable[..., MainWindow]  # noqa: F811
) -> None:
    w = open_window(max_tokens=4)
    send(qtbot, w, "hello")
    w.apply_settings(replace(w.current_settings(), context_length=300))  # "as default", as the dialog's box is
    assert w.current_settings().context_length == 300  # this conversation's
    w.new_conversation()
    assert w.current_settings().context_length == 0  # a new chat: the model's own context
    send(qtbot, w, "a new chat")
    assert w.current_settings().context_length == 0 and w.current_settings().sampler.max_tokens == 4


def test_regenerating_a_middle_reply_says_where_the_later_turns_went(
    qtbot: Any, open_window: Callable[..., MainWindow]  # noqa: F811
) -> None:
    w = open_window(max_tokens=4)
    send(qtbot, w, "one")
    first = replies(w)[-1]
    send(qtbot, w, "two")
    send(qtbot, w, "three")
    w.chat.select(first.id)
    said: list[str] = []
    w.chat.subscribe(ops.STATUS, lambda text, ms: said.append(text))
    ops.regenerate(w.chat, fresh=True)  # a new variant of the first reply
    wait_idle(qtbot, w)
    assert len(w.chat.vms) == 2  # the later turns belong to the previous variant
    assert said[-1].endswith(" · the 4 later messages stay with the previous variant (‹ › on the reply shows them again)")


def test_a_regenerate_on_another_number_of_ranks_names_the_world_size_as_the_cause(
    tiny_model: Path, tmp_path: Path
) -> None:
    """The real first reply and its real regenerate (tiny model); the regenerate's report as a
    2-rank server's would say (world size 2), its logprobs one ulp away (another summation order)."""
    import dataclasses

    from app.core.session import ChatSession, ChatSettings
    from app.core.store import ConversationStore
    from app.core.view_models import debug_vm
    from engine.engine import Engine
    from engine.types import SamplerSettings
    from tests.test_edge_promises import flip_low_bit

    store = ConversationStore(tmp_path / "db.sqlite3")
    engine = Engine(use_disk=False, chunk=16)
    engine.load(str(tiny_model))
    try:
        session = ChatSession(store)
        conv = session.new_conversation(ChatSettings(sampler=SamplerSettings(max_tokens=8, seed=3), random_seed=False))
        first = session.finish(p1 := session.begin_send(conv, "Why is the sky blue?"), engine.generate(p1.request))
        p2 = session.begin_regenerate(first.id)
        result = engine.generate(p2.request)
        lps = list(result.logprobs)
        lps[2] = flip_low_bit(lps[2])
        report = dataclasses.replace(result.report, world_size=2)
        session.finish(p2, dataclasses.replace(result, logprobs=lps, report=report))
        vm = session.view(conv)[-1]
        assert vm.identity.startswith("same tokens, logprobs differ by ") and vm.identity.endswith(
            " (on 2 ranks, the previous on 1 rank)")
        assert "another world size sums the layers in another order" in debug_vm(vm).rows["identity"]
        store.close()
        again = ChatSession(ConversationStore(tmp_path / "db.sqlite3"))  # read back: the same words
        assert again.view(conv)[-1].identity == vm.identity
        again.close()
    finally:
        engine.close()
