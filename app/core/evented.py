"""Plain-callback events for Qt-free models (napari's evented models, without Qt).

A model calls `emit(name, *args)` after it changed; views `subscribe(name, fn)` and get `fn(*args)`
on the thread that emitted (the GUI thread in the app). No queues, no signals: a test subscribes
the same way a widget does.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

log = logging.getLogger(__name__)


class Evented:
    def __init__(self) -> None:
        self._subscribers: dict[str, list[Callable[..., None]]] = {}

    def subscribe(self, event: str, fn: Callable[..., None]) -> Callable[[], None]:
        """Call `fn(*args)` on every `emit(event, *args)`; returns the unsubscribe function."""
        fns = self._subscribers.setdefault(event, [])
        fns.append(fn)
        return lambda: fn in fns and fns.remove(fn)  # type: ignore[func-returns-value]

    def emit(self, event: str, *args: Any) -> None:
        """Tell every subscriber; one that raises is logged and the others still hear it."""
        for fn in list(self._subscribers.get(event, ())):
            try:
                fn(*args)
            except Exception:
                log.exception("a subscriber of %r failed", event)
