"""A stored reply run again with no cache at all (no Qt): Verify's comparison (the debug panel),
Compare's B side (the inspector), and each token's text for the per-token view. The last few
cold runs are kept: Verify's is Compare's B side, and the other way round, never run twice.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any, Optional

from psygnal import Signal

from app.core.conversation.view_models import verify_text
from app.core.engine_link.model import EngineLink
from app.core.jobs import EngineJobs, user_message
from app.core.store import StoreError
from app.core.store.session import ChatSession
from engine.types import Comparison, GenerationRequest, GenerationResult

KEPT = 4  # the last cold runs (Verify's, Compare's): the other one reuses them


@dataclass(frozen=True)
class ColdRun:
    """One reply's cold run: by which model, of which request, what it made, each token's text."""

    model_key: str
    request: GenerationRequest
    result: GenerationResult
    pieces: list[str]


class ColdRuns:
    verify_changed = Signal(int, object)  # reply id, the verdict (None while the cold run runs)

    def __init__(self, jobs: EngineJobs, session: ChatSession, link: EngineLink) -> None:
        self.jobs, self.session, self.link = jobs, session, link
        self.kept: dict[int, ColdRun] = {}  # reply id -> its cold run, the oldest first
        self.verifying = False  # Verify's cold run is running (the debug panel's button waits)

    def verify(self, reply_id: int) -> None:
        """Generate a stored reply again with no cache at all and compare token by token."""
        try:
            request, _, _ = self.session.verify_inputs(reply_id)
            stored = self.session.message(reply_id).as_result()
        except StoreError as e:
            self.verify_changed.emit(reply_id, str(e))
            return
        self.verifying = True
        self.verify_changed.emit(reply_id, None)
        self.jobs.spawn(self._verify(reply_id, request, stored))

    async def _verify(self, reply_id: int, request: GenerationRequest, stored: GenerationResult) -> None:
        """Engine.verify's comparison, made here from its cold run, which Compare then reuses."""
        try:
            cold, cancelled = await self._run(reply_id, request)
            text = "failed: verification cancelled" if cancelled else \
                verify_text(Comparison.of(stored.tokens, stored.logprobs, cold.result.tokens, cold.result.logprobs))
        except Exception as e:
            text = f"failed: {user_message(e)}"
        self.verifying = False
        if not self.jobs.closed:
            self.verify_changed.emit(reply_id, text)

    async def _run(self, reply_id: int, request: GenerationRequest) -> tuple[ColdRun, bool]:
        """The one cold-run job (Verify's and Compare's): `request` with no cache at all, on the
        engine thread, and its token texts; kept for the other one unless it was cancelled (the
        window closed). Returns (the run, cancelled)."""
        cancel = self.jobs.cancel_token()

        def job(engine: Any) -> tuple[GenerationResult, list[str]]:
            result = engine.cold_run(request, cancel)
            return result, engine.token_texts(result.tokens)

        try:
            result, pieces = await self.jobs.call(job)
        finally:
            self.jobs.release(cancel)
        info = self.link.info
        run = ColdRun(info.key if info is not None else "", request, result, pieces)
        if not cancel.cancelled:
            self.kept.pop(reply_id, None)
            self.kept[reply_id] = run
            while len(self.kept) > KEPT:
                self.kept.pop(next(iter(self.kept)))
        return run, cancel.cancelled

    def _request(self, reply_id: int) -> GenerationRequest:
        m = self.session.message(reply_id)
        key = m.model_key or (m.report.model_key if m.report else None)
        model = self.link.identity()
        if model is None or key != model.key:
            raise StoreError("a cold run needs the model that made this reply loaded")
        request, _, _ = self.session.verify_inputs(reply_id)
        if m.status == "interrupted":  # run cold as far as it got
            request = replace(request, context_policy="refuse", context_length=None)
        return request

    def has(self, reply_id: int) -> bool:
        """Whether a cold run of this reply's request, by the loaded model, was made already."""
        kept = self.kept.get(reply_id)
        try:
            return kept is not None and self.link.info is not None and kept.model_key == self.link.info.key \
                and kept.request == self._request(reply_id)
        except StoreError:
            return False

    async def run(self, reply_id: int) -> ColdRun:
        """A stored reply's request run with no cache at all (as far as a stopped reply got), and
        its token texts; the one Verify (or a Compare) just made when there is one. Needs the model
        that made the reply."""
        request = self._request(reply_id)
        if self.has(reply_id):
            return replace(self.kept[reply_id], request=request)
        # Shielded: a caller that stops waiting (a newer comparison) leaves the run to end and be kept.
        run, _ = await asyncio.shield(self.jobs.spawn(self._run(reply_id, request)))
        return run

    async def token_pieces(self, tokens: list[int], model_key: Optional[str]) -> Optional[list[str]]:
        """Each token's text, when the loaded model made the reply (else None: ids are shown)."""
        model = self.link.identity()
        if not tokens or model_key is None or model is None or model_key != model.key:
            return None
        try:
            return await self.jobs.call(lambda e: e.token_texts(tokens))
        except Exception:
            return None
