"""Counts the next prompt (the conversation + the draft) as the user types, for the context meter.

Debounced (a single-shot QTimer: counting starts DEBOUNCE_MS after the last change) and off the
GUI thread: the count is a job on the engine executor (Engine.measure), since the tokenizer
belongs to the loaded model and lives on that thread. One count runs at a time; a change while
one runs makes it stale: its result is dropped and the latest draft is counted next.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from PySide6.QtCore import QObject, QTimer, Signal

from app.core.context_budget import BudgetRequests, ContextBudget
from app.qt import jobs
from engine.engine import Engine
from engine.executor import EngineExecutor

log = logging.getLogger(__name__)


def count(engine: Engine, what: BudgetRequests) -> ContextBudget:
    """On the engine thread: the whole next prompt, and the draft alone."""
    full = engine.measure(what.full)
    alone = engine.measure(what.alone).prompt_tokens if what.alone is not None else 0
    return ContextBudget(full.prompt_tokens, full.limit, what.max_tokens, what.policy, alone)


class DraftCounter(QObject):
    counted = Signal(object)  # ContextBudget, or None: nothing to count (an empty chat, no draft)

    DEBOUNCE_MS = 250

    def __init__(self, executor: EngineExecutor, what: Callable[[], Optional[BudgetRequests]],
                 parent: Optional[QObject] = None) -> None:  # fmt: skip
        """`what`: called on the GUI thread when a count starts; what to count now."""
        super().__init__(parent)
        self.executor = executor
        self.what = what
        self.timer = QTimer(self)
        self.timer.setSingleShot(True)
        self.timer.setInterval(self.DEBOUNCE_MS)
        self.timer.timeout.connect(self._start)
        self._running: Optional[Any] = None  # the count in flight
        self._stale = False  # something changed while it ran
        self.closed = False

    def schedule(self) -> None:
        """Something the count depends on changed (the draft, the conversation, the settings, the model)."""
        if self._running is not None:
            self._stale = True
        self.timer.start()  # restarts: the latest change wins

    def _start(self) -> None:
        if self.closed:
            return
        if self._running is not None:
            self._stale = True  # counted again when the running one ends
            return
        what = self.what()
        if what is None:
            self.counted.emit(None)
            return
        self._stale = False
        self._running = jobs.spawn(self._count(what))

    async def _count(self, what: BudgetRequests) -> None:
        try:
            budget: Optional[ContextBudget] = await jobs.on_engine(self.executor, lambda e: count(e, what))
        except Exception as e:  # no model loaded yet, a model that cannot render these messages
            log.info("cannot count the draft: %s", e)
            budget = None
        self._running = None
        if self.closed:
            return
        if self._stale:
            self._start()  # the draft changed meanwhile: count the latest, show this one never
            return
        if budget is not None:
            self.counted.emit(budget)

    def close(self) -> None:
        self.closed = True
        self.timer.stop()
