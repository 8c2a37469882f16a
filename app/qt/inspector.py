"""The determinism inspector's flows: the compare view, the per-token view, receipts.

Wired to the chat view's footer buttons (Tokens, Compare, Receipt) and the debug panel's
Compare button. Token texts and cold runs come from the engine thread (the loaded model's
tokenizer and weights) as coroutines on the qasync loop, like the controller's flows; a reply
made by another model than the loaded one is shown by token ids, and cannot be run cold.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QFileDialog

from app.core.compare import CompareData, Side, compare
from app.core.session import ModelIdentity
from app.core.store import StoreError
from app.qt import jobs
from app.qt.widgets.compare_view import CompareView
from engine.engine import Engine
from engine.types import GenerationRequest

if TYPE_CHECKING:
    from app.core.session import ChatSession
    from app.qt.controller import ChatController, ChatWindow

    class InspectedWindow(ChatWindow):  # app/qt/window.py's MainWindow (no import: no cycle)
        session: ChatSession
        controller: ChatController

log = logging.getLogger(__name__)


class Inspector(QObject):
    compared = Signal(object)  # CompareData, once shown
    tokensShown = Signal(int)  # reply id
    receiptWritten = Signal(str)  # path

    def __init__(self, window: "InspectedWindow") -> None:
        super().__init__(window)  # type: ignore[arg-type]
        self.w = window
        self.view: Optional[CompareView] = None
        self.last: Optional[CompareData] = None
        window.chat_view.compareRequested.connect(lambda rid: self.open_compare(rid))
        window.chat_view.tokensToggled.connect(self.toggle_tokens)
        window.chat_view.receiptRequested.connect(lambda rid: self.export_receipt(rid))
        window.debug_panel.compareRequested.connect(lambda rid: self.open_compare(rid))

    # ----------------------------------------------------------------------------- helpers
    def model_identity(self) -> Optional[ModelIdentity]:
        c = self.w.controller
        info = c.model_info
        if info is None or not c.model_ready:
            return None
        return ModelIdentity(c.model_spec, info.key, info.name, info.dequantized)

    def _loaded_key(self) -> Optional[str]:
        model = self.model_identity()
        return model.key if model is not None else None

    async def pieces(self, tokens: list[int], model_key: Optional[str]) -> Optional[list[str]]:
        """Each token's text, when the loaded model made the reply (else None: ids are shown)."""
        if not tokens or model_key is None or model_key != self._loaded_key():
            return None
        try:
            return await jobs.on_engine(self.w.controller.executor, lambda e: e.token_texts(tokens))
        except Exception:
            log.exception("cannot decode tokens")
            return None

    # ----------------------------------------------------------------------------- compare
    def open_compare(self, reply_id: int, other_id: Optional[int] = None) -> CompareView:
        """Open (or raise) the compare view on `reply_id` against `other_id`: by default the
        variant it was regenerated from, else the variant before it, else a cold run of it."""
        if self.view is None:
            self.view = CompareView(self.w)
            self.view.sidesChanged.connect(lambda a, b: self._spawn(self._compare(a, b)))
            self.view.coldRequested.connect(lambda a: self._spawn(self._compare(a, None)))
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
        self._spawn(self._compare(reply_id, other_id))
        return self.view

    def _spawn(self, coro: Any) -> None:
        self.w.controller._spawn(coro)

    async def _side(self, message_id: int, label: str) -> Side:
        m = self.w.session.store.get_message(message_id)
        side = Side.of_message(m, label)
        pieces = await self.pieces(side.tokens, m.model_key or (m.report.model_key if m.report else None))
        return replace(side, pieces=pieces)

    async def _compare(self, a_id: int, b_id: Optional[int]) -> None:
        view = self.view
        assert view is not None
        labels = dict((m.id, label) for m, label in self.w.session.compare_candidates(a_id))
        try:
            a = await self._side(a_id, labels.get(a_id, f"message #{a_id}"))
            if b_id is not None:
                b = await self._side(b_id, labels.get(b_id, f"message #{b_id}"))
            else:
                view.set_busy("running A again with no cache at all…")
                b = await self._cold_side(a_id, a)
        except (StoreError, Exception) as e:  # noqa: BLE001 (any failure is shown, not raised)
            view.set_busy(f"cannot compare: {jobs.user_message(e)}")
            return
        data = compare(a, b)
        if self.view is view:
            view.set_data(data)
            self.last = data
            self.compared.emit(data)

    async def _cold_side(self, a_id: int, a: Side) -> Side:
        m = self.w.session.store.get_message(a_id)
        key = m.model_key or (m.report.model_key if m.report else None)
        if key != self._loaded_key():
            raise StoreError("a cold run needs the model that made this reply loaded")
        request, tokens, _ = self.w.session.verify_inputs(a_id)
        if m.status == "interrupted":  # run cold as far as it got
            request = GenerationRequest(request.messages, request.sampler, request.mode)
        cancel = self.w.controller.cancel_token()

        def job(engine: Engine) -> Any:
            result = engine.cold_run(request, cancel)
            return result, engine.token_texts(result.tokens)

        result, pieces = await jobs.on_engine(self.w.controller.executor, job)
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
        m = self.w.session.store.get_message(reply_id)
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
            path, _ = QFileDialog.getSaveFileName(self.w, "Export receipt", f"reply-{reply_id}.receipt.json",
                                                  "Verbatim receipt (*.json)")
            if not path:
                return None
        try:
            Path(path).write_text(receipt.to_json() + "\n", encoding="utf-8")
        except OSError as e:
            self.w.show_error("Cannot export a receipt", str(e))
            return None
        note = "" if receipt.model.spec else " (the model that made it is not loaded: verify needs --model)"
        self.w.status(f"Receipt written to {path}{note}: python -m engine verify {Path(path).name}", 8000)
        self.receiptWritten.emit(path)
        return path
