"""How GUI tests drive the real window and what they observe of it: the actions a user takes
(send, click, connect to a server), the settings every test starts from, and the events the
window's chat model emitted, recorded by subscribing as any view does (no counters or
last-values kept in the app for tests). The fixtures that build windows are in conftest.py."""

from __future__ import annotations

import json
import weakref
from pathlib import Path
from typing import Any, Optional

from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QAction, QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication, QPushButton, QWidget

from app.core.store import ChatSettings
from engine.types import SamplerSettings

ROOT = Path(__file__).resolve().parents[2]
LONG = 20_000  # ms: generous waits; each returns as soon as its condition holds
SERVER = 60_000  # ms: a reply from two ranks sharing two cores with the window
TEST_SEED = 7
LONG_PROMPT = "Why is the sky blue? Because of Rayleigh scattering of sunlight. " * 30  # ~1000 tokens
TURN = "Tell me more about the colours of the evening sky over the sea, please. " * 3  # ~50 tokens
CTRL = Qt.KeyboardModifier.ControlModifier


def settings(max_tokens: int = 24, temperature: float = 0.9, logit_bias: Any = (), **kw: Any) -> ChatSettings:
    """Sampled replies with one fixed seed, so a run that passes passes again (tests of fresh
    seeds use "New variant", which always draws one)."""
    sampler = SamplerSettings(temperature=temperature, top_p=0.95, max_tokens=max_tokens, seed=TEST_SEED,
                              logit_bias=logit_bias)
    return ChatSettings(sampler=sampler, random_seed=False, **kw)


def no_reply_ends(model: Path) -> dict[str, float]:
    """A logit_bias that keeps a random-weight model from sampling the special tokens it would
    end a reply at (its end and turn tokens): for tests whose replies must run to max_tokens."""
    added = json.loads((Path(model) / "tokenizer.json").read_text())["added_tokens"]
    return {str(t["id"]): -100.0 for t in added if t.get("special")}


def send(qtbot: Any, w: Any, text: str, wait: bool = True) -> None:
    """Type `text` and click Send; the reply starts at once, or (documents with it) once the
    draft is counted and fits (ops.send)."""
    w.composer.setPlainText(text)
    qtbot.mouseClick(w.findChild(QPushButton, "sendButton"), Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.chat.generation.busy, timeout=LONG)
    if wait:
        wait_idle(qtbot, w)


def status_said(w: Any) -> str:
    """The last status the window said: in the status bar, or whole in the notice area when it
    was too long for the status bar (app/qt/window/status.py)."""
    return w.statusBar().currentMessage() or w.notice.text()


def wait_idle(qtbot: Any, w: Any) -> None:
    qtbot.waitUntil(lambda: not w.chat.generation.busy, timeout=LONG)


def settle(view: Any) -> None:
    """Let the layout finish (message heights follow their width over a few passes): until the
    canvas keeps its height and nothing is queued."""
    def sized() -> bool:  # the scroll area gave the canvas the height its layout needs (not yet: squeezed)
        canvas = view.widget()
        return canvas.height() == max(view.viewport().height(), canvas.minimumSizeHint().height())

    seen: list[int] = []
    while len(seen) < 3 or len(set(seen[-3:])) > 1 or view._move_queued or not sized():
        QApplication.processEvents()
        seen.append(view.widget().height())
        assert len(seen) < 1000


def click(qtbot: Any, w: Any, name: str) -> None:
    button = w.findChild(QPushButton, name)
    assert button is not None and button.isEnabled(), name
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)


def replies(w: Any) -> list[Any]:
    return [vm for vm in w.chat.conversation.vms if vm.role == "assistant"]


def connect(qtbot: Any, w: Any, url: str, key: str = "", remember: bool = False) -> None:
    """Models -> "Connect to a Verbatim server…", the address typed, Connect clicked."""
    from app.qt.engine_link.server_dialog import ServerDialog

    w.findChild(QAction, "connectServerAction").trigger()
    dlg = next(d for d in w.findChildren(ServerDialog, "serverDialog") if d.isVisible())
    dlg.url.setText(url)
    dlg.key.setText(key)
    dlg.remember.setChecked(remember)
    qtbot.mouseClick(dlg.connect_button, Qt.MouseButton.LeftButton)
    w.activateWindow()  # the window's shortcuts (Ctrl+R) again
    qtbot.waitUntil(w.isActiveWindow, timeout=LONG)


class Watch:
    """Every streamed batch, prefill step, finished reply and error of one window's chat."""

    def __init__(self, chat: Any) -> None:
        self.stream_updates = 0  # text updates the views got (batching evidence)
        self.prefill: list[tuple[int, int]] = []
        self.finished: Optional[Any] = None  # app.core.generation.model.FinishedReply: pending, result, saved
        self.errors: list[tuple[str, str]] = []
        chat.generation.streamed.connect(self._stream)
        chat.generation.prefilled.connect(lambda rid, done, total: self.prefill.append((done, total)))
        chat.generation.finished.connect(lambda done: setattr(self, "finished", done))
        chat.notices.error_raised.connect(lambda title, text: self.errors.append((title, text)))

    def _stream(self, reply_id: int, text: str, count: int) -> None:
        self.stream_updates += 1

    @property
    def last_error(self) -> Optional[str]:
        return self.errors[-1][1] if self.errors else None


_watches: "weakref.WeakKeyDictionary[Any, Watch]" = weakref.WeakKeyDictionary()


def watch(window: Any) -> Watch:
    """The window's Watch, made on first use (call it right after building the window)."""
    if window not in _watches:
        _watches[window] = Watch(window.chat)
    return _watches[window]


def wait_compared(qtbot: Any, window: Any, action: Any, timeout: int = 20_000) -> Any:
    """Run `action` (a click that opens or changes the compare view) and wait until the view
    shows a new comparison; returns it (app.core.conversation.compare.CompareData)."""
    before = window.inspector.last
    action()
    qtbot.waitUntil(lambda: window.inspector.last is not before, timeout=timeout)
    return window.inspector.last


def shortcut_clashes(w: Any) -> list[str]:
    """Key sequences that two shortcuts of the window can both claim at once (Qt then runs
    neither: "Ambiguous shortcut overload"), with this platform's key bindings. A window-wide
    shortcut clashes with any other of the same keys; widget-only ones clash when their widgets
    are the same or one contains the other."""
    from PySide6.QtGui import QAction, QKeySequence, QShortcut

    Ctx = Qt.ShortcutContext
    owners: dict[str, list[tuple[str, Any, Any]]] = {}
    for a in w.findChildren(QAction):
        for seq in a.shortcuts():
            owners.setdefault(seq.toString(QKeySequence.SequenceFormat.PortableText), []).append(
                (a.text() or a.objectName(), a.shortcutContext(), w))
    for sc in w.findChildren(QShortcut):
        for seq in sc.keys():
            owners.setdefault(seq.toString(QKeySequence.SequenceFormat.PortableText), []).append(
                (f"QShortcut on {sc.parent().objectName()}", sc.context(), sc.parent()))

    def overlap(a: tuple[str, Any, Any], b: tuple[str, Any, Any]) -> bool:
        if Ctx.WidgetShortcut not in (a[1], b[1]) and Ctx.WidgetWithChildrenShortcut not in (a[1], b[1]):
            return True
        if a[1] in (Ctx.WindowShortcut, Ctx.ApplicationShortcut) or b[1] in (Ctx.WindowShortcut, Ctx.ApplicationShortcut):
            return True
        return a[2] is b[2] or a[2].isAncestorOf(b[2]) or b[2].isAncestorOf(a[2])

    clashes = []
    for keys, who in owners.items():
        for i, a in enumerate(who):
            for b in who[i + 1:]:
                if overlap(a, b):
                    clashes.append(f"{keys}: {a[0]} / {b[0]}")
    return clashes


def chips(w: Any) -> list[str]:
    return w.attach.bar.chips.texts()


def counted(w: Any, n: int) -> None:
    """Wait until `n` chips show their token count."""
    def done() -> bool:
        items = w.chat.composer.attachments.items
        return len(items) == n and all(a.tokens is not None for a in items) and len(chips(w)) == n
    return done  # type: ignore[return-value]


def drop(target: QWidget, *paths: Path) -> tuple[bool, bool]:
    """Drag `paths` over `target` and drop them there (as a file manager does); returns whether
    the drag and the drop were accepted."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    enter = QDragEnterEvent(QPoint(5, 5), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                            Qt.KeyboardModifier.NoModifier)  # fmt: skip
    QApplication.sendEvent(target, enter)
    event = QDropEvent(QPointF(5, 5), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                       Qt.KeyboardModifier.NoModifier)  # fmt: skip
    QApplication.sendEvent(target, event)
    return enter.isAccepted(), event.isAccepted()


class Node:
    pass


def cycles(n: int) -> list[weakref.ref[Node]]:
    """n unreachable reference cycles (only the cyclic collector can free them)."""
    refs = []
    for _ in range(n):
        a, b = Node(), Node()
        a.other, b.other = b, a
        refs.append(weakref.ref(a))
    return refs
