"""What GUI tests observe of a window's chat model: the events it emitted, recorded by
subscribing as any view does (no counters or last-values kept in the app for tests)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Optional

from app.core import ops


@dataclass
class Finished:
    pending: Any  # app.core.session.PendingReply, as the reply ended (outcome, duplicate_of, run)
    result: Any  # engine.types.GenerationResult


class Watch:
    """Every STREAM / PREFILL / FINISHED / ERROR event of one chat model."""

    def __init__(self, chat: ops.ChatModel) -> None:
        self.stream_updates = 0  # text updates the views got (batching evidence)
        self.prefill: list[tuple[int, int]] = []
        self.finished: Optional[Finished] = None
        self.errors: list[tuple[str, str]] = []
        chat.subscribe(ops.STREAM, self._stream)
        chat.subscribe(ops.PREFILL, lambda rid, done, total: self.prefill.append((done, total)))
        chat.subscribe(ops.FINISHED, lambda pending, result: setattr(self, "finished", Finished(pending, result)))
        chat.subscribe(ops.ERROR, lambda title, text: self.errors.append((title, text)))

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
    shows a new comparison; returns it (app.core.compare.CompareData)."""
    before = window.inspector.last
    action()
    qtbot.waitUntil(lambda: window.inspector.last is not before, timeout=timeout)
    return window.inspector.last
