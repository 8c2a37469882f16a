"""How the window draws and binds what it shows (pytest-qt, offscreen): every shortcut the same
keys on every platform and unambiguous, safe rendering of model text, code plain while streamed and
highlighted once complete, a new reply and its badge shown at once, disabled buttons and menu items
drawn disabled, elided labels that keep their text, docstrings that name files that exist."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QApplication

from app.qt.window.window import MainWindow
from tests.gui.driver import send, shortcut_clashes

pytestmark = pytest.mark.gui


def _styled(body: Any, word: str) -> bool:
    """Whether the first run of text containing `word` in a message body has a colour or weight
    of its own (what Pygments' inline styles give a keyword)."""
    from PySide6.QtGui import QFont, QTextCursor

    doc = body.document()
    found = doc.find(word)
    assert not found.isNull(), word
    cursor = QTextCursor(doc)
    cursor.setPosition(found.selectionStart() + 1)
    fmt = cursor.charFormat()
    return fmt.foreground().style() != Qt.BrushStyle.NoBrush or fmt.fontWeight() > QFont.Weight.Normal


# -- 8i. disabled buttons drawn disabled -------------------------------------------------------------
def _ink(button: Any) -> int:
    """How far the button's text stands out from its face: the lightness range of its pixels,
    inside the border (grabbed as drawn)."""
    image = button.grab().toImage()
    inset = 4
    values = [image.pixelColor(x, y).lightness() for x in range(inset, image.width() - inset)
              for y in range(inset, image.height() - inset)]  # fmt: skip
    return max(values) - min(values)


def test_shortcuts_are_the_same_keys_on_every_platform_and_unambiguous(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    """QKeySequence.StandardKey means different chords per platform, sometimes two (Delete is
    also Ctrl+D on X11, the debug panel's key): the app spells every shortcut out instead, so
    this check on one platform holds on all (Qt maps Ctrl to Cmd on macOS). The same check runs
    with X11's key bindings in tests/xcb_window_checks.py."""
    import ast

    root = Path(__file__).resolve().parents[2] / "app"
    uses = [f"{p.name}:{n.lineno}" for p in root.rglob("*.py") for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
            if isinstance(n, ast.Attribute) and n.attr == "StandardKey"]  # fmt: skip
    assert uses == []
    w = open_window()
    assert shortcut_clashes(w) == []
    names = {a.objectName(): a for a in w.findChildren(QAction)}
    assert names["debugAction"].shortcut().toString() == "Ctrl+D"


def test_code_block_copy_link_and_safe_rendering(qtbot: Any, open_window: Callable[..., MainWindow]) -> None:
    from app.core.conversation.view_models import MessageVM
    from app.qt.conversation.chat_view import MessageWidget

    w = open_window(wait=False)
    text = "Try:\n\n```python\nprint('<b>hi</b>')\n```\n\n<img src='http://example.com/x.png'><script>x()</script>"
    vm = MessageVM(1, "assistant", text, "complete", 1, 1, None, None)
    widget = MessageWidget(vm, w.theme.code)
    qtbot.addWidget(widget)
    html = widget.body.toHtml()
    assert "<script" not in html and "<img" not in html and "&lt;script&gt;" in html
    assert widget.body.code_blocks == ["print('<b>hi</b>')"]
    from PySide6.QtCore import QUrl

    widget.body.anchorClicked.emit(QUrl("copy:0"))
    assert QApplication.clipboard().text() == "print('<b>hi</b>')"


def test_streamed_code_is_plain_while_written_and_highlighted_once_complete(qtbot: Any) -> None:
    from app.core.conversation.view_models import MessageVM
    from app.qt.theme import theme_named
    from app.qt.conversation.chat_view import ChatView

    view = ChatView(theme_named("light").code)
    qtbot.addWidget(view)
    vm = MessageVM(id=1, role="assistant", content="", status="generating", variant=1, variants=1,
                   prev_id=None, next_id=None)
    view.set_messages([vm])
    body = view.widget_for(1).body
    small = "Here:\n```python\ndef f():\n    return 1\n"
    view.stream(1, small, 12)
    assert not _styled(body, "return")  # the block is still being written
    view.stream(1, small + "```\nDone", 14)
    assert _styled(body, "return")  # complete and within the budget: coloured while streaming
    big = small + "\n".join(f"    total_{i} = compute({i})" for i in range(120)) + "\n```\nDone"
    view.stream(1, big, 400)
    assert not _styled(body, "return")  # over the streaming budget: plain until the reply ends
    view.end_stream(1)
    view.set_messages([replace(vm, content=big, status="complete")])
    assert _styled(view.widget_for(1).body, "return")


def test_a_reply_new_to_the_view_and_its_badge_are_shown_when_set_messages_returns(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    # Qt shows a widget new to a layout by a queued call; CI once read the identity badge of a
    # reply the view had just rebuilt as hidden. No event may be needed between the two.
    from app.core.conversation.view_models import MessageVM

    w = open_window(wait=False)
    view = w.chat_view
    assert view.isVisible()
    vm = MessageVM(901, "assistant", "Hello.", "complete", 1, 1, None, None, identity="identical to previous")
    view.set_messages([vm])
    widget = view.widget_for(901)
    assert widget is not None and widget.isVisible()
    assert widget.identity.isVisible() and widget.identity.text().endswith("identical to previous")
    view.set_messages([])
    assert view.widget_for(901) is None and view.empty.isVisible()


def test_disabled_regenerate_and_new_variant_are_drawn_disabled(
    qtbot: Any, open_window: Callable[..., MainWindow]
) -> None:
    w = open_window(max_tokens=4)
    buttons = (w.reply_bar.regenerate_button, w.reply_bar.new_variant_button)
    assert not any(b.isEnabled() for b in buttons)  # an empty chat: nothing to regenerate
    disabled = [_ink(b) for b in buttons]
    send(qtbot, w, "one")
    assert all(b.isEnabled() for b in buttons)
    enabled = [_ink(b) for b in buttons]
    for off, on in zip(disabled, enabled):
        assert off < on * 0.5, (off, on)  # faint text on a flat face, not the enabled look


# -- 10. a disabled menu item looks disabled -------------------------------------------------------
@pytest.mark.parametrize("theme", ["light", "dark"])
def test_a_disabled_menu_item_is_drawn_unlike_an_enabled_one(
    qtbot: Any, open_window: Callable[..., MainWindow], theme: str  # noqa: F811
) -> None:
    from PySide6.QtGui import QAction

    w = open_window(wait=False, theme=theme)
    menu = w.models.disconnect_action.associatedObjects()[0]  # the Models menu
    connect = w.findChild(QAction, "connectServerAction")
    assert not w.models.disconnect_action.isEnabled() and connect.isEnabled()  # not attached to a server
    menu.adjustSize()
    image = menu.grab().toImage()

    def ink(action: Any) -> int:
        """How far the item's darkest (light theme) or brightest (dark) pixel is from its background."""
        r = menu.actionGeometry(action)
        bg = image.pixelColor(r.left() + 2, r.top() + 2).lightness()
        return max(abs(image.pixelColor(x, y).lightness() - bg)
                   for x in range(r.left(), r.right()) for y in range(r.top(), r.bottom()))  # fmt: skip

    enabled, disabled = ink(connect), ink(w.models.disconnect_action)
    assert disabled < 0.75 * enabled, (enabled, disabled)


def test_elided_label_keeps_its_text_and_shows_it_as_tooltip(qtbot: Any) -> None:
    from app.qt.widgets.elided_label import ElidedLabel

    label = ElidedLabel("✓ identical to an existing variant (not added again)")
    qtbot.addWidget(label)
    label.show()
    label.resize(label.sizeHint())
    assert not label.is_elided() and label.toolTip() == ""
    assert label.minimumSizeHint().width() < label.sizeHint().width() // 2  # rows can shrink it
    label.resize(60, label.height())
    assert label.is_elided() and label.text() == "✓ identical to an existing variant (not added again)"
    assert label.toolTip() == label.text()
    label.setToolTip("explained")  # a tooltip of the caller's own wins
    assert label.toolTip() == "explained"


def test_the_window_module_names_only_files_that_exist() -> None:
    import re

    import app.qt.window.window as window

    root = Path(window.__file__).resolve().parents[3]
    named = set(re.findall(r"app/[\w/]+\.py", window.__doc__ or ""))
    assert named and [p for p in sorted(named) if not (root / p).is_file()] == []
