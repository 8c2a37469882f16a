"""The determinism inspector's flows: the compare view, the per-token view, receipts.

Bound to the chat view's footer buttons (Tokens, Compare, Receipt) and the debug panel's Compare
button. Token texts and cold runs come from the engine thread through the cold runs
(app/core/engine_link/cold_runs.py), as coroutines on the qasync loop; a reply made by another
model than the loaded one is shown by token ids, and cannot be run cold. Stored replies are read
through the session. Only the latest comparison asked for is shown: a newer one cancels the one
before (whose cold run, if it had one, still ends and is kept).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from PySide6.QtCore import QObject, QSettings, Signal
from PySide6.QtWidgets import QWidget

from app.core.chat import Chat
from app.core.conversation.compare import CompareData, Side, compare
from app.core.jobs import user_message
from app.core.store import StoreError
from app.core.store.session import ModelIdentity
from app.qt import dialogs
from app.qt.conversation.chat_view import ChatView
from app.qt.inspector.compare_view import CompareView
from app.qt.inspector.debug_panel import DebugPanel

log = logging.getLogger(__name__)


class Inspector(QObject):
    tokensShown = Signal(int)  # reply id
    receiptWritten = Signal(str)  # path

    def __init__(self, chat: Chat, chat_view: ChatView, debug_panel: DebugPanel, parent: QWidget,
                 qsettings: QSettings) -> None:  # fmt: skip
        super().__init__(parent)
        self.chat, self.chat_view, self.parent_widget, self.qsettings = chat, chat_view, parent, qsettings
        self.view: Optional[CompareView] = None
        self.last: Optional[CompareData] = None  # what the compare view shows
        self._comparing: Optional["asyncio.Task[Any]"] = None  # the latest comparison asked for
        chat_view.compareRequested.connect(lambda rid: self.open_compare(rid))
        chat_view.tokensToggled.connect(self.toggle_tokens)
        chat_view.receiptRequested.connect(lambda rid: self.export_receipt(rid))
        debug_panel.compareRequested.connect(lambda rid: self.open_compare(rid))

    def model_identity(self) -> Optional[ModelIdentity]:
        return self.chat.link.identity()

    async def pieces(self, tokens: list[int], model_key: Optional[str]) -> Optional[list[str]]:
        return await self.chat.cold_runs.token_pieces(tokens, model_key)

    # ----------------------------------------------------------------------------- compare
    def open_compare(self, reply_id: int, other_id: Optional[int] = None) -> CompareView:
        """Open (or raise) the compare view on `reply_id` against `other_id`: by default the
        variant it was regenerated from, else the variant before it, else a cold run of it."""
        if self.view is None:
            self.view = CompareView(self.parent_widget)
            self.view.sidesChanged.connect(lambda a, b: self._begin(a, b))
            self.view.coldRequested.connect(lambda a: self._begin(a, None))
        try:
            candidates = self.chat.session.compare_candidates(reply_id)
        except StoreError as e:
            self.chat.notices.error("Cannot compare", str(e))
            return self.view
        ids = [m.id for m, _ in candidates]
        if other_id is None and reply_id in ids:
            source = next(m for m, _ in candidates if m.id == reply_id).outcome.previous_id
            if source in ids and source != reply_id:
                other_id = source
            elif len(ids) > 1:
                i = ids.index(reply_id)
                other_id = ids[i - 1] if i > 0 else ids[1]
        self.view.set_choices([(m.id, label) for m, label in candidates], reply_id, other_id)
        self.view.show()
        self.view.raise_()
        self._begin(reply_id, other_id)
        return self.view

    def _begin(self, a_id: int, b_id: Optional[int]) -> None:
        """A new comparison: the view is cleared at once (never the previous comparison under
        this one's busy line) and only the latest one asked for is shown."""
        assert self.view is not None
        if self._comparing is not None:
            self._comparing.cancel()  # never shown: this one is
        self.view.clear("comparing…")
        self._comparing = self.chat.jobs.spawn(self._compare(a_id, b_id))

    async def _side(self, message_id: int, label: str) -> Side:
        m = self.chat.session.message(message_id)
        side = Side.of_message(m, label)
        pieces = await self.pieces(side.tokens, m.model_key or (m.report.model_key if m.report else None))
        return replace(side, pieces=pieces)

    async def _compare(self, a_id: int, b_id: Optional[int]) -> None:
        view = self.view
        assert view is not None
        labels = dict((m.id, label) for m, label in self.chat.session.compare_candidates(a_id))
        try:
            a = await self._side(a_id, labels.get(a_id, f"message #{a_id}"))
            if b_id is not None:
                b = await self._side(b_id, labels.get(b_id, f"message #{b_id}"))
            else:
                if not self.chat.cold_runs.has(a_id):
                    view.set_busy("running A again with no cache at all…")
                b = await self._cold_side(a_id, a)
        except Exception as e:  # any failure is shown, not raised (a cancelled one is not an Exception)
            view.set_busy(f"cannot compare: {user_message(e)}")
            return
        data = compare(a, b)
        if self.view is view:
            view.set_data(data)
            self.last = data

    async def _cold_side(self, a_id: int, a: Side) -> Side:
        run = await self.chat.cold_runs.run(a_id)
        side = Side.of_result(run.result, f"cold run of {a.label}", run.request.mode, run.request.sampler.to_dict())
        return replace(side, pieces=run.pieces)

    # --------------------------------------------------------------------------- per token
    def toggle_tokens(self, reply_id: int, on: bool) -> None:
        widget = self.chat_view.widget_for(reply_id)
        if widget is None:
            return
        if not on:
            widget.hide_tokens()
            return
        self.chat.jobs.spawn(self._show_tokens(reply_id))

    async def _show_tokens(self, reply_id: int) -> None:
        m = self.chat.session.message(reply_id)
        pieces = await self.pieces(list(m.tokens or []), m.model_key)
        widget = self.chat_view.widget_for(reply_id)
        if widget is not None and widget.tokens_button.isChecked():
            widget.show_tokens(list(m.tokens or []), pieces, list(m.logprobs or []))
            self.tokensShown.emit(reply_id)

    # ----------------------------------------------------------------------------- receipts
    def export_receipt(self, reply_id: int, path: Optional[str] = None) -> Optional[str]:
        """Write a reply's receipt (asks where unless `path` is given); returns the path."""
        model = self.model_identity() or ModelIdentity("", "")
        try:
            receipt = self.chat.session.receipt(reply_id, model)
        except StoreError as e:
            self.chat.notices.error("Cannot export a receipt", str(e))
            return None
        if path is None:
            path = dialogs.save_path(self.parent_widget, self.qsettings, "Export receipt",
                                     f"reply-{reply_id}.receipt.json", "Verbatim receipt (*.json)")
            if not path:
                return None
        try:
            Path(path).write_text(receipt.to_json() + "\n", encoding="utf-8")
        except OSError as e:
            self.chat.notices.error("Cannot export a receipt", str(e))
            return None
        note = "" if receipt.model.spec else " (the model that made it is not loaded: verify needs --model)"
        said = f"Receipt written to {path}{note}: python -m engine verify {Path(path).name}"
        self.chat.notices.status(said, 8000)
        self.chat.notices.tell(said)  # how to check it, whole: not only in the status bar, which elides
        self.receiptWritten.emit(path)
        return path
