"""The reply being made (no Qt): the pending reply (frozen, as begun), its text and progress as
it streams, the replay of a regenerate expected to repeat its reply, and the token that stops it.
The chat view binds to its signals; the status line and the window's buttons follow `started`
and `ended`. Only its own methods write its fields and emit them.

One reply, from `start` on:

    start(pending)   the conversation shows it (Conversation.follow_reply), the status line says so
                     `live_changed`: the run in progress (live_run.py), advanced once a batch by the
                     engine's RestoreEvent, PrefillProgress and first token; None when it ended
    _generate        engine_batches(executor, request, observe=ReplyRecorder)
                       engine thread: ReplyRecorder saves text + tokens every few seconds, then the
                       reply and its run (ChatSession.finish -> SavedReply)
                       loop: each batch -> `streamed` / `prefilled` (and `replayed`), once a batch
    the Done         the conversation reads the path again (Conversation.reply_saved), `finished`
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

from psygnal import Signal

from app.core.composer.context_budget import refusal_text
from app.core.composer.model import Composer
from app.core.conversation.listing import ConversationList
from app.core.conversation.model import Conversation
from app.core.conversation.view_models import finished_text, progress_text
from app.core.engine_link.model import EngineLink
from app.core.generation.continuing import earlier_of, whole_result
from app.core.generation.live_run import LiveRun
from app.core.generation.replay import Replay, expect
from app.core.generation.reply_recorder import ReplyRecorder
from app.core.jobs import EngineJobs, user_message
from app.core.notices import Notices
from app.core.store import Action, ReplyOutcome, StoreError
from app.core.store.session import ChatSession, PendingReply, SavedReply
from engine.bridge import Done, engine_batches
from engine.errors import ContextLengthError, RequestError, ServerUnreachable
from engine.types import CancelToken, GenerationResult, PrefillProgress, TokenEvent


@dataclass(frozen=True)
class StreamState:
    """The pending reply as it streams: its text and tokens so far, the prefill's progress."""

    text: str = ""
    tokens: int = 0
    prefill: Optional[tuple[int, int]] = None


@dataclass(frozen=True)
class FinishedReply:
    """A reply that ended: as it was begun, what the engine returned (the whole reply for a
    Continue), and what was saved (None when the saving itself failed)."""

    pending: PendingReply
    result: GenerationResult
    saved: Optional[SavedReply]


class Generation:
    started = Signal(object)  # PendingReply: a reply started (the buttons wait, the chat view streams)
    ended = Signal(object)  # PendingReply: it ended (saved, failed or taken back)
    streamed = Signal(int, str, int)  # reply id, its text so far, tokens so far (once a batch)
    prefilled = Signal(int, int, int)  # reply id, prompt tokens in the cache so far, of how many
    replayed = Signal(int, object)  # reply id, Replay: a regenerate expected to repeat, as verified so far
    live_changed = Signal(object)  # Optional[LiveRun]: the run in progress as far as it got (None: none)
    finished = Signal(object)  # FinishedReply: a reply ended and was saved

    def __init__(self, session: ChatSession, jobs: EngineJobs, conversation: Conversation, listing: ConversationList,
                 composer: Composer, link: EngineLink, notices: Notices, batch_interval: float = 0.05) -> None:  # fmt: skip
        self.session, self.jobs, self.notices = session, jobs, notices
        self.conversation, self.listing, self.composer, self.link = conversation, listing, composer, link
        self.batch_interval = batch_interval
        self.pending: Optional[PendingReply] = None
        self.stream = StreamState()
        self.replay: Optional[Replay] = None  # the pending regenerate's verification (replay.py)
        self.live: Optional[LiveRun] = None  # the pending reply's run as far as it got (live_run.py)
        self._offset = 0  # a Continue: tokens of the reply before it (event indices start after)
        self._cancel = CancelToken()  # the pending reply's

    @property
    def busy(self) -> bool:
        """A reply is being generated: what must wait for it says so (app/core/ops.py)."""
        return self.pending is not None

    # ------------------------------------------------------------------------------ start, stop
    def start(self, pending: PendingReply) -> None:
        """Generate `pending` (its rows are saved already), showing it as it streams."""
        self.notices.tell("")  # the next action: an earlier explanation is over
        self.pending = pending
        earlier, _ = earlier_of(pending)  # a Continue streams on from the reply so far
        self.stream = StreamState(pending.earlier_text, len(earlier))
        self._offset = len(earlier)
        self.replay = self._expected_repeat(pending)
        self.live = LiveRun(pending.reply_id, pending.action)
        self._cancel = self.jobs.cancel_token()
        self.jobs.spawn(self._generate(pending, self._cancel))
        self.started.emit(pending)
        self.live_changed.emit(self.live)
        self.listing.refresh()
        self.conversation.follow_reply(pending)
        if earlier:
            self.streamed.emit(pending.reply_id, self.stream.text, self.stream.tokens)
        self.notices.status(progress_text(pending.action, pending.request.sampler.seed), 0)
        if self.replay is not None:  # the previous reply's text, at once; verified as it streams
            self.replayed.emit(pending.reply_id, self.replay)

    def stop(self) -> bool:
        """Stop the reply being generated: it ends with what it has, saved as interrupted."""
        if self.pending is None:
            return False
        self._cancel.cancel()
        self.notices.status("Stopping…", 2000)
        return True

    def _expected_repeat(self, pending: PendingReply) -> Optional[Replay]:
        """The replay of the reply a regenerate should repeat (None: not expected to)."""
        if pending.action is not Action.REGENERATE or pending.previous_id is None:
            return None
        try:
            previous = self.session.message(pending.previous_id)
        except StoreError:
            return None
        return expect(pending.action, pending.request.mode, pending.model_key, previous)

    # ------------------------------------------------------------------------------ the flow
    async def _generate(self, pending: PendingReply, cancel: CancelToken) -> None:
        """Generate `pending` on the engine thread (saved there), showing it as it streams."""
        recorder = ReplyRecorder(self.session, pending)
        result: Optional[GenerationResult] = None
        try:
            # Documents' states stay warm while a conversation has them (engine/cache/eviction.py).
            in_use = self.session.store.document_digests()
            await self.jobs.call(lambda engine: engine.keep_documents(in_use))
            async for batch in engine_batches(self.jobs.executor, pending.request, cancel, loop=self.jobs.loop,
                                              interval=self.batch_interval, observe=recorder):
                result = self._apply(pending, batch)
        except Exception as e:
            if not self.jobs.closed:
                self._end()
                if too_long(e) and pending.action is Action.SEND and not self.stream.text:
                    self._take_back(pending, e)
                    return
                self.conversation.reload()
                if isinstance(e, ServerUnreachable):
                    self.link.link_down(str(e))
                self.notices.error("The reply could not be generated", user_message(e))
                if too_long(e) and pending.action is Action.RETRY:  # a message saved unanswerable: how to repair it
                    self.notices.tell(REPAIR)
            return
        finally:
            self.jobs.release(cancel)
        if self.jobs.closed or result is None:
            return
        result = whole_result(pending, result)
        replay = self.replay
        if replay is not None:  # confirmed (or not) only now that the engine's last token is in
            replay.end(result.tokens, result.logprobs, result.finish_reason == "cancelled")
            self.replayed.emit(pending.reply_id, replay)
        self._end()
        saved = recorder.saved  # written on the engine thread before the Done was posted
        twin = saved.duplicate_of if saved is not None else None
        self.conversation.reply_saved(twin if twin is not None else pending.reply_id)
        self.finished.emit(FinishedReply(pending, result, saved))
        note = f" · {hidden_note(pending.hidden)}" if pending.hidden else ""
        outcome = saved.outcome if saved is not None else ReplyOutcome(pending.action, pending.previous_id)
        self.notices.status(finished_text(result, outcome) + note, 8000)
        if pending.hidden:  # a branch: said where it stays, not only in the status bar (which elides)
            hidden = hidden_note(pending.hidden)
            self.notices.tell(f"{hidden[0].upper()}{hidden[1:]}.")
        if result.report.warnings:  # the engine hands each disk problem over once: keep it in view
            self.notices.banner("Prompt cache: " + "; ".join(result.report.warnings)
                                + " Replies still work; the cache is kept in memory only.")  # fmt: skip
        await self.link.refresh_stats()

    def _apply(self, pending: PendingReply, batch: list[Any]) -> Optional[GenerationResult]:
        """One batch of events: the streamed text and progress, told once per batch."""
        pieces: list[str] = []
        result: Optional[GenerationResult] = None
        replay = self.replay
        tokens, prefill = self.stream.tokens, self.stream.prefill
        for event in batch:
            if isinstance(event, TokenEvent):
                pieces.append(event.text)
                tokens = self._offset + event.index + 1
                if replay is not None:
                    replay.feed(event.index, event.token, event.logprob, event.text)
            elif isinstance(event, PrefillProgress):
                prefill = (event.done, event.total)
            elif isinstance(event, Done):
                result = event.result
        if self.jobs.closed or self.pending is not pending:
            return result
        self.stream = s = replace(self.stream, text=self.stream.text + "".join(pieces), tokens=tokens, prefill=prefill)
        live = self.live.advanced(batch) if self.live is not None else None
        if live != self.live:  # once a batch: the restore, the prefill's progress, decode begun
            self.live = live
            self.live_changed.emit(live)
        if pieces:  # the last batch too: what streamed is what was generated
            self.streamed.emit(pending.reply_id, s.text, s.tokens)
            if replay is not None:  # once a batch, as the text: the count shown follows the engine
                self.replayed.emit(pending.reply_id, replay)
        elif s.prefill is not None and not s.text:
            self.prefilled.emit(pending.reply_id, *s.prefill)
        return result

    def _end(self) -> None:
        pending = self.pending
        self.pending = None
        self.stream = StreamState()
        self.replay = None
        live, self.live = self.live, None
        if live is not None:
            self.live_changed.emit(None)
        if pending is not None:
            self.ended.emit(pending)
            self.listing.refresh()

    def _take_back(self, pending: PendingReply, e: Exception) -> None:
        """The engine refused a send before any prefill (it did not fit, the meter had not
        counted it: the composer counts a send with documents first, so this is the last guard):
        the user's message leaves the conversation and goes back to the composer with its files."""
        text = str(pending.request.messages[-1].get("content", "")) if pending.request.messages else ""
        mine = pending.request.documents[len(pending.request.documents) - self._own_documents(pending):]
        withdrawn = False
        try:
            withdrawn = self.session.withdraw(pending)
        except StoreError:
            pass
        if withdrawn:
            self.conversation.forget()  # the send had made the conversation: it is gone with it
        else:
            self.conversation.reload()
        self.listing.refresh()
        self.composer.take_back(text, mine)
        if not isinstance(e, ContextLengthError):  # the documents' own refusal says it with its numbers
            self.notices.error("Not sent", f"Not sent: {e}. What you typed is back in the composer.")
            return
        limit = self.conversation.settings().context_length
        model = self.link.info.context_length if self.link.info is not None else None
        self.notices.error("Not sent", refusal_text(e.prompt_tokens, e.max_tokens, e.context_length, limit, model))

    def _own_documents(self, pending: PendingReply) -> int:
        """How many of the request's documents the user message itself carries."""
        try:
            return len(self.session.store.documents([pending.user_id]).get(pending.user_id, []))
        except StoreError:
            return 0


REPAIR = ("This message cannot be answered: it does not fit the context with its documents. Take a file off it"
          " (× on its chip) or delete the message; Regenerate then answers it.")


def too_long(e: BaseException) -> bool:
    """The engine refused the request before any prefill because it does not fit the context:
    the conversation (ContextLengthError) or its documents (never cut, never left out)."""
    return isinstance(e, ContextLengthError) or (isinstance(e, RequestError) and e.param == "documents")


def hidden_note(n: int) -> str:
    """What a regenerate or new variant of a middle reply did to the turns after it."""
    return (f"the {n} later message{'s' if n != 1 else ''} stay with the previous variant"
            " (‹ › on the reply shows them again)")
