"""What the window tells the user outside a reply (no Qt): the status line, an error, the banner,
and the notice (an explanation that stays in view, wrapped, until the next reply or conversation:
never only in the status bar, which elides). Any sub-model or operation says it through `Notices`;
the status bar, the error dialog, the banner and the notice widget bind to its signals.
"""

from __future__ import annotations

from psygnal import Signal


class Notices:
    status_changed = Signal(str, int)  # text, how long to show it (ms; 0: until the next)
    error_raised = Signal(str, str)  # title, text
    banner_changed = Signal(str)  # text ('' hides it)
    notice_changed = Signal(str)  # text ('' clears it)

    def __init__(self) -> None:
        self.notice = ""  # the explanation in view
        self.closed = False  # the window closed: nothing more is told

    def status(self, text: str, ms: int = 0) -> None:
        if not self.closed:
            self.status_changed.emit(text, ms)

    def error(self, title: str, text: str) -> None:
        if not self.closed:
            self.error_raised.emit(title, text)

    def banner(self, text: str) -> None:
        if not self.closed:
            self.banner_changed.emit(text)

    def tell(self, text: str) -> None:
        """An explanation the user must be able to read whole (why a send did not go, where a
        regenerate put the later turns): it stays until the next reply or conversation ('' clears)."""
        if text != self.notice and not self.closed:
            self.notice = text
            self.notice_changed.emit(text)

    def close(self) -> None:
        self.closed = True
