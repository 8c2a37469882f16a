"""The determinism inspector's flows: the compare view, the per-token view, receipts.

Wired to the chat view's footer buttons (Tokens, Compare, Receipt) and the debug panel's
Compare button. Token texts and cold runs come from the engine thread through the chat model
(app/core/engine_link/flows.py), as coroutines on the qasync loop; a reply made by another model than
the loaded one is shown by token ids, and cannot be run cold. Stored replies are read through the
session.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from PySide6.QtCore import QObject, Signal

from app.core.engine_link import flows
from app.core.conversation.compare import CompareData, Side, compare
from app.core.session import ModelIdentity
from app.core.store import StoreError
from app.qt import dialogs, jobs
from app.qt.inspector.compare_view import CompareView

MainWindow = Any  # app/qt/window/window.py's (not imported: the window imports this module)

log = logging.getLogger(__name__)


class Inspector(QObject):
    tokensShown = Signal(int)  # reply id
    receiptWritten = Signal(str)  # path

    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)  # type: ignore[arg-type]
        self.w = window
        self.view: Optional[CompareView] = None
        self.last: Optional[CompareData] = None  # what the compare view shows
        self._seq = 0  # comparisons started; only the latest one is shown
        window.chat_view.compareRequested.connect(lambda rid: self.open_compare(rid))
        window.chat_view.tokensToggled.connect(self.toggle_tokens)
        window.chat_view.receiptRequested.connect(lambda rid: self.export_receipt(rid))
        window.debug_panel.compareRequested.connect(lambda rid: self.open_compare(rid))

    def model_identity(self) -> Optional[ModelIdentity]:
        return flows.model_identity(self.w.chat)

    async def pieces(self, tokens: list[int], model_key: Optional[str]) -> Optional[list[str]]:
        return await flows.token_pieces(self.w.chat, tokens, model_key)

    # ----------------------------------------------------------------------------- compare
    def open_compare(self, reply_id: int, other_id: Optional[int] = None) -> CompareView:
        """Open (or raise) the compare view on `reply_id` against `other_id`: by default the
        variant it was regenerated from, else the variant before it, else a cold run of it."""
        if self.view is None:
            self.view = CompareView(self.w)
            self.view.sidesChanged.connect(lambda a, b: self._begin(a, b))
            self.view.coldRequested.connect(lambda a: self._begin(a, None))
        try:
            candidates = self.w.session.compare_candidates(reply_id)
        except StoreError as e:
            self.w.show_error("Cannot compare", str(e))
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
        self._seq += 1
        self.view.clear("comparing…")
        self._spawn(self._compare(a_id, b_id, self._seq))

    def _spawn(self, coro: Any) -> None:
        self.w.chat.spawn(coro)

    async def _side(self, message_id: int, label: str) -> Side:
        m = self.w.session.message(message_id)
        side = Side.of_message(m, label)
        pieces = await self.pieces(side.tokens, m.model_key or (m.report.model_key if m.report else None))
        return replace(side, pieces=pieces)

    async def _compare(self, a_id: int, b_id: Optional[int], seq: int) -> None:
        view = self.view
        assert view is not None
        labels = dict((m.id, label) for m, label in self.w.session.compare_candidates(a_id))
        try:
            a = await self._side(a_id, labels.get(a_id, f"message #{a_id}"))
            if b_id is not None:
                b = await self._side(b_id, labels.get(b_id, f"message #{b_id}"))
            else:
                if not flows.has_cold_run(self.w.chat, a_id):
                    view.set_busy("running A again with no cache at all…")
                b = await self._cold_side(a_id, a)
        except (StoreError, Exception) as e:  # noqa: BLE001 (any failure is shown, not raised)
            if seq == self._seq:
                view.set_busy(f"cannot compare: {jobs.user_message(e)}")
            return
        data = compare(a, b)
        if self.view is view and seq == self._seq:  # a later comparison was asked for: it shows
            view.set_data(data)
            self.last = data

    async def _cold_side(self, a_id: int, a: Side) -> Side:
        request, result, pieces = await flows.cold_run(self.w.chat, a_id)
        side = Side.of_result(result, f"cold run of {a.label}", request.mode, request.sampler.to_dict())
        return replace(side, pieces=pieces)

    # --------------------------------------------------------------------------- per token
    def toggle_tokens(self, reply_id: int, on: bool) -> None:
        widget = self.w.chat_view.widget_for(reply_id)
        if widget is None:
            return
        if not on:
            widget.hide_tokens()
            return
        self._spawn(self._show_tokens(reply_id))

    async def _show_tokens(self, reply_id: int) -> None:
        m = self.w.session.message(reply_id)
        pieces = await self.pieces(list(m.tokens or []), m.model_key)
        widget = self.w.chat_view.widget_for(reply_id)
        if widget is not None and widget.tokens_button.isChecked():
            widget.show_tokens(list(m.tokens or []), pieces, list(m.logprobs or []))
            self.tokensShown.emit(reply_id)

    # ----------------------------------------------------------------------------- receipts
    def export_receipt(self, reply_id: int, path: Optional[str] = None) -> Optional[str]:
        """Write a reply's receipt (asks where unless `path` is given); returns the path."""
        model = self.model_identity() or ModelIdentity("", "")
        try:
            receipt = self.w.session.receipt(reply_id, model)
        except StoreError as e:
            self.w.show_error("Cannot export a receipt", str(e))
            return None
        if path is None:
            path = dialogs.save_path(self.w, self.w.qsettings, "Export receipt", f"reply-{reply_id}.receipt.json",
                                     "Verbatim receipt (*.json)")
            if not path:
                return None
        try:
            Path(path).write_text(receipt.to_json() + "\n", encoding="utf-8")
        except OSError as e:
            self.w.show_error("Cannot export a receipt", str(e))
            return None
        note = "" if receipt.model.spec else " (the model that made it is not loaded: verify needs --model)"
        said = f"Receipt written to {path}{note}: python -m engine verify {Path(path).name}"
        self.w.status(said, 8000)
        self.w.chat.tell(said)  # how to check it, whole: not only in the status bar, which elides
        self.receiptWritten.emit(path)
        return path
