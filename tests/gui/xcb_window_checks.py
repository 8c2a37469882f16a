"""The window under a real X server (QT_QPA_PLATFORM=xcb, Xvfb): what offscreen cannot show.

Not collected by the plain suite (the name does not start with test_): tests/gui/test_xcb.py
runs this module in a pytest subprocess under `xvfb-run -a` with the xcb platform. The offscreen
platform uses the Windows keyboard scheme and no window manager, so shortcut clashes of the X11
scheme (QKeySequence.StandardKey.Delete is also Ctrl+D there) and real window sizes show only here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtCore import QPoint, QRect, Qt  # noqa: E402
from PySide6.QtWidgets import QLabel, QMessageBox, QWidget  # noqa: E402

from app.core import ops  # noqa: E402
from app.qt.window.window import MainWindow  # noqa: E402
from tests.gui.driver import LONG, send  # noqa: E402

pytestmark = pytest.mark.gui

SIZES = [MainWindow.MIN_SIZE, (1000, 700), (1400, 900)]  # the smallest the window allows, two larger
DEMO_NAME = "SmolLM2-135M-Instruct (demo)"  # as long a model name as the demo model's
LONG_WORDS = "Supercalifragilisticexpialidocious " * 12 + "x" * 300


def test_platform_is_xcb() -> None:
    from PySide6.QtGui import QGuiApplication

    assert os.environ.get("QT_QPA_PLATFORM") == "xcb"
    assert QGuiApplication.platformName() == "xcb"


def _visible_rect(w: QWidget, ref: QWidget) -> QRect:
    return QRect(w.mapTo(ref, QPoint(0, 0)), w.size())


def _problems(w: MainWindow) -> list[str]:
    """Every visible part of a message that extends past the conversation's viewport, a body
    shorter than its text, and parts of one message drawn over each other."""
    from app.qt.conversation.chat_view import MessageBody

    vp = w.chat_view.viewport()
    bad = []
    for mw in w.chat_view.message_widgets():
        for c in [mw, *mw.findChildren(QWidget)]:
            if not c.isVisibleTo(w):
                continue
            r = _visible_rect(c, vp)
            if r.left() < 0 or r.right() >= vp.width():
                bad.append(f"{type(c).__name__}#{c.objectName()} {r.left()}..{r.right()} outside 0..{vp.width() - 1}")
            if isinstance(c, MessageBody) and c.document().size().height() > c.height():
                bad.append(f"message {mw.vm.id}: body {c.height()} px for {c.document().size().height():.0f} px of text")
        parts = [c for c in mw.findChildren(QWidget) if c.parentWidget() is mw and c.isVisibleTo(w)]
        for i, a in enumerate(parts):
            for b in parts[i + 1:]:
                if a.geometry().intersects(b.geometry()):
                    bad.append(f"message {mw.vm.id}: {a.objectName()} overlaps {b.objectName()}")
    return bad


def _cut_text(label: Any) -> str:
    """Why `label` does not show all of its text ('' when it does): an elided label that elides,
    a one-line label narrower than its text, a wrapped one shorter than its wrapped text."""
    from PySide6.QtGui import QFontMetrics

    from app.qt.widgets.elided_label import ElidedLabel

    name = f"{label.objectName() or type(label).__name__} {label.text()!r}"
    if isinstance(label, ElidedLabel):
        return f"{name} elided to {QLabel.text(label)!r} in {label.width()} px" if label.is_elided() else ""
    fm, room = QFontMetrics(label.font()), label.contentsRect()
    room.adjust(label.margin(), label.margin(), -label.margin(), -label.margin())
    if label.wordWrap():
        need = fm.boundingRect(QRect(0, 0, room.width(), 100_000), int(Qt.TextFlag.TextWordWrap), label.text())
        if need.width() > room.width() or need.height() > room.height():
            return f"{name} needs {need.width()}x{need.height()} px, has {room.width()}x{room.height()}"
        return ""
    need_w = fm.horizontalAdvance(label.text())
    return f"{name} needs {need_w} px, has {room.width()}" if need_w > room.width() else ""


def _cut_labels(w: MainWindow) -> list[str]:
    """Every visible label of a reply (role, navigator, footer, identity badge), the context
    meter's label and its warning that does not show its whole text."""
    labels = [c for mw in w.chat_view.message_widgets() for c in mw.findChildren(QLabel)]
    labels += w.context_meter.findChildren(QLabel) + [w.context_meter.warning]
    return [cut for c in labels if c.isVisibleTo(w) and c.text() and (cut := _cut_text(c))]


def _settle(qtbot: Any, w: MainWindow) -> None:
    """Wait until the window's layout stops changing: the same geometry twice in a row."""
    last: list[Any] = [None]

    def snapshot() -> Any:
        parts = [w.debug_panel, w.sidebar, w.chat_view, *w.chat_view.message_widgets()]
        parts += [m.body for m in w.chat_view.message_widgets()]
        return [p.geometry().getRect() for p in parts] + [w.chat_view.widget().width()]

    def stable() -> bool:
        now, before = snapshot(), last[0]
        last[0] = now
        return now == before

    qtbot.waitUntil(stable, timeout=LONG)
    qtbot.waitUntil(stable, timeout=LONG)


@pytest.mark.parametrize("size", SIZES, ids=[f"{a}x{b}" for a, b in SIZES])
def test_messages_fit_the_viewport_with_the_dock_open(
    qtbot: Any, open_window: Callable[..., MainWindow], size: tuple[int, int], tmp_path: Path
) -> None:
    from dataclasses import replace

    w = open_window(max_tokens=24)
    w.show()
    send(qtbot, w, LONG_WORDS)
    # A model name as long as the demo model's on the reply's role line.
    w.session.store.update_message(w.chat.conversation.vms[-1].id, model_name=DEMO_NAME)
    w.chat.conversation.reload()
    w.model_picker.select(w.model_picker.spec, DEMO_NAME)  # and in the top bar's picker
    ops.regenerate(w.chat, fresh=False)  # an identity badge on the reply
    qtbot.waitUntil(lambda: not w.chat.generation.busy, timeout=LONG)
    assert w.chat_view.message_widgets()[-1].identity.isVisible()
    # A per-conversation limit and a draft past it: the meter and its warning are shown too.
    w.settings.apply(replace(w.chat.conversation.settings(), context_length=512))
    w.composer.setPlainText(LONG_WORDS)
    qtbot.waitUntil(lambda: w.context_meter.warning.isVisibleTo(w), timeout=LONG)
    assert w.context_meter.label.text().endswith(" / 512")
    w.debug_panel.show()
    w.resize(*size)
    qtbot.waitUntil(lambda: w.width() == size[0] and w.chat_view.viewport().width() > 0, timeout=LONG)
    _settle(qtbot, w)
    assert w.chat_view.message_widgets()[-1].identity.isVisible()  # the badge is among those checked
    problems = _problems(w) + _cut_labels(w)
    assert not problems, "\n".join(problems)
    # The dock's contents fit its width (values wrap below their labels): no sideways scrolling.
    inner = w.findChild(QWidget, "debugInner")
    assert inner.width() <= inner.parentWidget().width(), (inner.width(), inner.parentWidget().width())
    # The top bar: nothing drawn over anything else.
    top = [c for c in (w.model_picker, w.model_status, w.settings_button, w.debug_button) if c.isVisible()]
    for i, a in enumerate(top):
        for b in top[i + 1:]:
            assert not a.geometry().intersects(b.geometry()), (a.objectName(), b.objectName())
    # Nothing that says what is in force disappears or is cut at the edge: the settings summary
    # shows all of itself, the model's name is drawn whole or elided (its tooltip whole), the
    # status bar's model and memory labels show their text.
    summary = w.reply_bar.summary
    assert summary.isVisible() and summary.text() and not _cut_text(summary), _cut_text(summary)
    shown = w.model_picker.shown_text()
    assert shown == DEMO_NAME or ("…" in shown and DEMO_NAME in w.model_picker.toolTip()), shown
    assert [cut for c in (w.models.model_label, w.models.memory_label) if (cut := _cut_text(c))] == []
    w.grab().save(str(Path(os.environ.get("VERBATIM_SHOTS", tmp_path)) / f"window-{size[0]}x{size[1]}.png"))
    # Made larger again, the dock gets its width back: the layers table's headers are not clipped.
    w.resize(1400, 900)
    qtbot.waitUntil(lambda: w.width() == 1400, timeout=LONG)
    _settle(qtbot, w)
    from app.qt.window.dock_width import WIDTH

    assert w.debug_panel.width() >= WIDTH, w.debug_panel.width()
    header = w.debug_panel.layers.horizontalHeader()
    fm = header.fontMetrics()
    clipped = [header.model().headerData(i, Qt.Orientation.Horizontal) for i in range(header.count())
               if header.sectionSize(i) < fm.horizontalAdvance(str(header.model().headerData(i, Qt.Orientation.Horizontal)))]
    assert clipped == [], clipped


def _ready(qtbot: Any, open_window: Callable[..., MainWindow]) -> MainWindow:
    w = open_window(max_tokens=8)
    w.show()
    qtbot.waitExposed(w)
    w.activateWindow()
    qtbot.waitUntil(w.isActiveWindow, timeout=LONG)
    return w


def test_ctrl_d_toggles_the_debug_dock_from_anywhere(qtbot: Any, open_window: Callable[..., MainWindow]) -> None:
    w = _ready(qtbot, open_window)
    send(qtbot, w, "hello")
    body = w.chat_view.message_widgets()[-1].body
    for target in (w.composer, w.sidebar.list, w.sidebar.search, body, w.chat_view):
        target.setFocus()
        qtbot.waitUntil(target.hasFocus, timeout=LONG)
        assert not w.debug_panel.isVisible()
        qtbot.keyClick(target, Qt.Key.Key_D, Qt.KeyboardModifier.ControlModifier)
        qtbot.waitUntil(w.debug_panel.isVisible, timeout=LONG)
        qtbot.keyClick(target, Qt.Key.Key_D, Qt.KeyboardModifier.ControlModifier)
        qtbot.waitUntil(lambda: not w.debug_panel.isVisible(), timeout=LONG)
    assert w.composer.toPlainText() == ""


class DialogWatch:
    """Answers every modal message box that opens (Escape), noting its default button: a test
    that opens one by mistake fails instead of waiting forever on it."""

    def __init__(self) -> None:
        from PySide6.QtCore import QTimer

        self.seen: list[Any] = []
        self.timer = QTimer()
        self.timer.timeout.connect(self._check)
        self.timer.start(20)

    def _check(self) -> None:
        from PySide6.QtWidgets import QApplication

        box = QApplication.activeModalWidget()
        if isinstance(box, QMessageBox) and box.isVisible():
            self.seen.append(box.standardButton(box.defaultButton()))
            box.reject()


def test_delete_key_only_in_the_list_and_its_dialog_defaults_to_cancel(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    w = _ready(qtbot, open_window)
    send(qtbot, w, "keep me")
    watch = DialogWatch()
    body = w.chat_view.message_widgets()[-1].body
    for target in (body, w.composer):
        target.setFocus()
        qtbot.waitUntil(target.hasFocus, timeout=LONG)
        qtbot.keyClick(target, Qt.Key.Key_Delete)
    assert watch.seen == [] and w.sidebar.list.count() == 1  # Delete there is not "delete the chat"
    w.sidebar.list.setFocus()
    qtbot.waitUntil(w.sidebar.list.hasFocus, timeout=LONG)
    qtbot.keyClick(w.sidebar.list, Qt.Key.Key_Delete)  # returns once the watch answered
    assert watch.seen == [QMessageBox.StandardButton.Cancel]
    assert w.sidebar.list.count() == 1  # Escape (and the default, Enter) keep the conversation
    watch.timer.stop()


def test_every_shortcut_is_unambiguous_and_the_status_bar_shows_memory(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    import re

    from tests.gui.driver import shortcut_clashes

    w = _ready(qtbot, open_window)
    assert shortcut_clashes(w) == []
    assert re.match(r"Memory \d+(\.\d+)? [KMG]B", w.models.memory_label.text()), w.models.memory_label.text()
    assert w.models.memory_label.isVisible()


def test_ctrl_f_goes_to_the_conversation_search_from_anywhere(qtbot: Any, open_window: Callable[..., MainWindow]) -> None:
    w = _ready(qtbot, open_window)
    send(qtbot, w, "hello")
    w.sidebar.search.setText("old query")
    body = w.chat_view.message_widgets()[-1].body
    for target in (w.composer, body, w.sidebar.list, w.chat_view):
        target.setFocus()
        qtbot.waitUntil(target.hasFocus, timeout=LONG)
        qtbot.keyClick(target, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)
        qtbot.waitUntil(w.sidebar.search.hasFocus, timeout=LONG)
        assert w.sidebar.search.selectedText() == "old query"  # typing replaces the old search
    assert w.composer.toPlainText() == ""


def test_window_geometry_and_dock_are_restored_as_saved(
    qtbot: Any, open_window: Callable[..., MainWindow], tmp_path: Path
) -> None:
    data = tmp_path / "geometry"
    w = open_window(data_dir=data, max_tokens=4)
    w.show()
    qtbot.waitExposed(w)
    w.debug_panel.show()
    w.setGeometry(140, 90, 1010, 690)
    qtbot.waitUntil(lambda: w.geometry().getRect() == (140, 90, 1010, 690), timeout=LONG)
    saved = (w.geometry().getRect(), w.debug_panel.width(), w.sidebar.width())
    w.close()
    w2 = open_window(data_dir=data, max_tokens=4)
    qtbot.waitExposed(w2)
    qtbot.waitUntil(lambda: (w2.geometry().getRect(), w2.debug_panel.width(), w2.sidebar.width()) == saved,
                    timeout=LONG)  # fmt: skip
    assert w2.debug_panel.isVisible()


@pytest.mark.parametrize("size", [(1200, 800), (1000, 700), MainWindow.MIN_SIZE], ids=["1200x800", "1000x700", "800x600"])
def test_every_debug_panel_value_shows_all_its_lines(
    qtbot: Any, open_window: Callable[..., MainWindow], size: tuple[int, int]
) -> None:
    """Each value of the debug panel (the Sampler row's "…, max=48" among them) shows its whole
    wrapped text: none loses its last line while the dock has room below (issue 39)."""
    w = open_window(max_tokens=48)
    w.show()
    send(qtbot, w, "Why is the sky blue?")
    send(qtbot, w, "And the sunset?")  # a restore: the longest rows (chunks, snapshots, store)
    w.debug_panel.show()
    w.resize(*size)
    qtbot.waitUntil(lambda: w.width() == size[0], timeout=LONG)
    _settle(qtbot, w)
    assert "max=48" in w.debug_panel.value("sampler")
    values = [v for v in w.debug_panel.values.values() if v.isVisibleTo(w) and v.text()]
    cut = [c for v in values if (c := _cut_text(v))]
    assert not cut, "\n".join(cut)


@pytest.mark.parametrize("size", SIZES, ids=[f"{a}x{b}" for a, b in SIZES])
def test_attached_files_and_their_note_fit_at_every_size_with_the_dock_open(
    qtbot: Any, open_window: Callable[..., MainWindow], tmp_path: Path, size: tuple[int, int]
) -> None:
    """Chips with long names, a refusal and the mid-conversation note above the composer, the
    files then sent: no chip or note cut, the composer and Send still usable, the sent message's
    chips inside the conversation."""
    from tests.gui.driver import counted, drop
    from tests.document_files import pdf_bytes

    long_name = tmp_path / ("quarterly-results-and-the-board-minutes-" * 3 + "final.md")
    long_name.write_text("Revenue grew by twelve percent.\n")
    pdf = tmp_path / "report.pdf"
    pdf.write_bytes(pdf_bytes(["One page of text about the weather."]))
    blob = tmp_path / "blob.bin"
    blob.write_bytes(bytes(range(256)) * 64)
    w = open_window()
    w.resize(*size)
    w.debug_panel.show()
    send(qtbot, w, "Hello there")
    qtbot.waitUntil(lambda: not w.chat.generation.busy, timeout=LONG)
    w.composer.setPlainText("What do these say?")
    drop(w.composer, long_name, pdf, blob)
    qtbot.waitUntil(counted(w, 2), timeout=LONG)
    qtbot.waitUntil(lambda: "reads the conversation's" in w.attach.bar.note.text(), timeout=LONG)
    _settle(qtbot, w)
    labels = [c.label for c in w.attach.bar.chips.chips] + [w.attach.bar.note]
    assert [cut for c in labels if (cut := _cut_text(c))] == []
    assert "blob.bin" in w.attach.bar.note.text()
    root = w.centralWidget()
    for part in (w.composer, w.reply_bar.send_button, w.attach.button, *w.attach.bar.chips.chips):
        r = _visible_rect(part, root)
        assert r.left() >= 0 and r.right() < root.width() and r.bottom() < root.height(), part.objectName()
    assert w.composer.width() >= 160  # the paperclip beside it leaves room to type, even at 800 px with the dock
    send(qtbot, w, "What do these say?")
    qtbot.waitUntil(lambda: not w.chat.generation.busy, timeout=LONG)
    _settle(qtbot, w)
    assert _problems(w) == []
    user = [vm for vm in w.chat.conversation.vms if vm.role == "user"][-1]
    chips = w.chat_view.widget_for(user.id).doc_chips
    assert len(chips.chips) == 2 and [cut for c in chips.chips if (cut := _cut_text(c.label))] == []
