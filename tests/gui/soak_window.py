"""A user's session in the real window, as rounds: what tests/test_soak_window.py runs a dozen
times and bench/soak.py for minutes. Each round, on a fresh conversation: a long reply streams,
Regenerate (identical, instant), New variant (a fresh seed), a reply stopped mid-stream, the
previous round's conversation opened again, the settings dialog and the model manager opened and
closed, the compare view (inspector) on the two variants, the debug panel shown and hidden.
Every step waits on the window's own state through `wait` (qtbot.waitUntil in a test) and
checks its outcome; the round returns what it made.

On PySide6 6.12.0 with Python 3.11 each streamed token takes references from None (issue 40):
about 400 tokens a round, a dozen rounds, abort the process long before the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QPushButton

Wait = Callable[[Callable[[], bool], int], None]  # (condition, timeout ms): returns once it holds
LONG = 60_000  # ms: only reached when something is stuck (then the wait fails)

PROMPTS = ("Tell me a long story about a lighthouse keeper.", "Explain, at length, how tides work.",
           "Describe a day in a busy bakery, in detail.", "Write a long letter to a friend abroad.")


@dataclass
class RoundReport:
    """What one round made (from the store: the window's own record)."""

    conv_id: int
    tokens: int  # tokens streamed this round, all replies together
    replies: int  # replies generated (Regenerate's identical one included)
    stopped_tokens: int  # tokens of the reply stopped mid-stream


@dataclass
class WindowSoak:
    w: Any  # app.qt.window.window.MainWindow, model loaded
    wait: Wait
    rounds: list[RoundReport] = field(default_factory=list)

    # ----------------------------------------------------------------------------- steps
    def click(self, name: str) -> None:
        button = self.w.findChild(QPushButton, name)
        assert button is not None and button.isEnabled(), name
        button.click()

    def idle(self) -> None:
        self.wait(lambda: not self.w.chat.generation.busy, LONG)

    def replies(self) -> list[Any]:
        return [vm for vm in self.w.chat.conversation.vms if vm.role == "assistant"]

    def stored(self, message_id: int) -> Any:
        return self.w.session.store.get_message(message_id)

    def send(self, text: str, wait: bool = True) -> None:
        self.w.composer.setPlainText(text)
        self.click("sendButton")
        assert self.w.chat.generation.busy
        if wait:
            self.idle()

    def close_modal_when_shown(self, cls: type) -> None:
        """Reject the modal dialog of type `cls` once it is up (QDialog.exec blocks the caller)."""

        def check() -> None:
            dlg = QApplication.activeModalWidget()
            if isinstance(dlg, cls):
                dlg.reject()
            else:
                QTimer.singleShot(10, check)

        QTimer.singleShot(0, check)

    def dialogs(self) -> None:
        """Settings (the window's own exec() path) and the model manager, opened and closed."""
        import shiboken6

        from app.qt.conversation.settings_dialog import SettingsDialog

        self.close_modal_when_shown(SettingsDialog)
        self.w.settings.open_dialog()  # returns when the dialog was rejected
        mgr = self.w.models.open_manager()
        self.wait(lambda: mgr.isVisible() and ("found" in mgr.status.text() or "No models" in mgr.status.text()), LONG)
        mgr.close()  # WA_DeleteOnClose: gone at the next event-loop turn
        self.wait(lambda: not shiboken6.isValid(mgr), LONG)

    def inspect(self, a_id: int, b_id: int) -> None:
        """The compare view on two variants, then closed; the debug panel shown and hidden."""
        before = self.w.inspector.last
        view = self.w.inspector.open_compare(a_id, b_id)
        self.wait(lambda: self.w.inspector.last is not before, LONG)
        data = self.w.inspector.last
        assert {data.a.message_id, data.b.message_id} == {a_id, b_id}
        assert data.a.tokens == list(self.stored(data.a.message_id).tokens)
        view.close()
        self.w.menus.debug_action.trigger()
        assert self.w.debug_panel.isVisible()
        self.w.menus.debug_action.trigger()
        assert not self.w.debug_panel.isVisible()

    # ----------------------------------------------------------------------------- a round
    def round(self) -> RoundReport:
        w, n = self.w, len(self.rounds)
        previous: Optional[int] = self.rounds[-1].conv_id if self.rounds else None
        w.conversations.new()
        self.send(f"{PROMPTS[n % len(PROMPTS)]} (round {n})")
        first = self.replies()[-1]
        first_tokens = list(self.stored(first.id).tokens)
        assert first.status == "complete" and first_tokens, first.status
        tokens, made = len(first_tokens), 1

        self.click("regenerateButton")  # unchanged conversation: identical, not added again
        self.idle()
        again = self.replies()[-1]
        assert again.id == first.id and again.navigator == "1 / 1", again.navigator
        tokens, made = tokens + len(first_tokens), made + 1

        self.click("newVariantButton")  # a fresh seed: a second variant
        self.idle()
        second = self.replies()[-1]
        assert second.id != first.id and second.navigator == "2 / 2", second.navigator
        tokens, made = tokens + len(self.stored(second.id).tokens), made + 1

        self.send("Go on, please.", wait=False)  # stopped mid-stream
        # A reply may also end on its own (an end token) before 20 characters: then there is
        # nothing left to stop (Stop is disabled), and waiting for more text would never end.
        self.wait(lambda: len(w.chat.generation.stream.text) > 20 or not w.chat.generation.busy, LONG)
        if w.chat.generation.busy:
            self.click("stopButton")
        self.idle()
        stopped = self.stored(self.replies()[-1].id)
        # Interrupted, unless the reply ended on its own (end of text) before the stop reached the
        # engine: a race the stop tests cover; here the session only has to go on.
        assert stopped.status in ("interrupted", "complete") and stopped.tokens, stopped.status
        tokens, made = tokens + len(stopped.tokens), made + 1
        conv_id = w.chat.conversation.conv_id
        assert conv_id is not None and len(w.chat.conversation.vms) == 4

        self.inspect(second.id, first.id)
        self.dialogs()
        if previous is not None:  # the previous round's conversation, from the sidebar
            self.wait(lambda: previous in w.sidebar.ids(), LONG)
            w.sidebar.list.setCurrentRow(w.sidebar.ids().index(previous))
            assert w.chat.conversation.conv_id == previous and len(w.chat.conversation.vms) == 4
        report = RoundReport(conv_id, tokens, made, len(stopped.tokens))
        self.rounds.append(report)
        return report
