"""The keys that scroll the conversation from wherever the focus is inside it (no widget of its
own: the chat view acts on them, a message's text and the Tokens view pass them up)."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeyEvent

SCROLL_KEYS = (Qt.Key.Key_PageUp, Qt.Key.Key_PageDown, Qt.Key.Key_Home, Qt.Key.Key_End)


def scrolls_the_conversation(event: QKeyEvent) -> bool:
    """PageUp, PageDown, Home, End, Ctrl+Home, Ctrl+End: they scroll the conversation from
    wherever the focus is inside it (a message's text, a button), as they scroll a browser's
    page; with Shift they stay the text's (selecting), and an editor keeps them all."""
    mods = event.modifiers() & ~Qt.KeyboardModifier.KeypadModifier
    return event.key() in SCROLL_KEYS and mods in (Qt.KeyboardModifier.NoModifier, Qt.KeyboardModifier.ControlModifier)
