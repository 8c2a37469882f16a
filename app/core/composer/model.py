"""The message being written (no Qt): the one holder of the draft's text and the files attached
to it, each conversation's draft kept while another is open (the text in the store too, across a
restart: app/core/composer/drafts.py), and the count of the next prompt against the context in
force (the meter, and whether Send would be refused).

The composer widget tells the model what is typed (`type`) and shows what the model sets
(`text_changed`: another conversation's draft, a send, a refused send's text back); the meter
binds to `budget_changed`, the chips to `attachments`. Counting needs the loaded model's
tokenizer, so it runs on the engine thread once changes pause (COUNT_DELAY_S: typing, a new path,
a reply starting all count once, and a long conversation's count never goes ahead of the reply),
and the latest count wins (a newer one cancels the one before, which never runs if it had not
started).
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional, Sequence

from psygnal import Signal

from app.core.composer.attachments import Attachments, token_cost
from app.core.composer.context_budget import ContextBudget, budget_requests, measure_budget
from app.core.composer.drafts import Drafts
from app.core.conversation.model import Conversation
from app.core.jobs import EngineJobs
from engine.documents.extract import Document

COUNT_DELAY_S = 0.3  # the next prompt is counted once changes (typing, the path, the model) pause this long


class Composer:
    text_changed = Signal(str)  # the draft's text changed (typed, or set here: the widget shows it)
    budget_changed = Signal(object)  # Optional[ContextBudget]: the next prompt against the limit in force

    def __init__(self, jobs: EngineJobs, conversation: Conversation, drafts: Drafts) -> None:
        self.jobs, self.conversation, self.drafts = jobs, conversation, drafts
        self.text = ""
        self.budget: Optional[ContextBudget] = None  # the last count of the next prompt
        self.budget_for: tuple[Optional[int], str] = (None, "")  # the conversation and text it counted
        # The files attached to the message being written, and those of the other conversations'
        # drafts while another is open (kept until quit).
        self.attachments = Attachments(jobs.loop, self._document_tokens, self.recount)
        self._stashed: dict[Optional[int], tuple[Document, ...]] = {}
        self._count: Optional["asyncio.Task[Any]"] = None  # the count under way
        self._count_at: Optional[asyncio.TimerHandle] = None  # the count waiting for changes to pause

    # ------------------------------------------------------------------------------ the text
    def type(self, text: str) -> None:
        """What the user typed: the next prompt is counted again once typing pauses."""
        if text != self.text:
            self._set(text)
            self.recount()

    def _set(self, text: str) -> None:
        if text != self.text:
            self.text = text
            self.text_changed.emit(text)

    def switch(self, conv_id: Optional[int]) -> None:
        """Another conversation is about to be shown: this one's draft (text and files) is kept
        with it, and `conv_id`'s is put back (a new chat starts empty)."""
        old = self.conversation.conv_id
        if conv_id != old:
            self._stashed[old] = self.attachments.documents
            self.attachments.set(self._stashed.pop(conv_id, ()))
            self.jobs.spawn(self.attachments.recount())
        self._set(self.drafts.switch(old, self.text, conv_id))

    def clear(self) -> None:
        """An empty draft (a new chat starts empty)."""
        self._set("")

    def sent(self, conv_id: Optional[int]) -> None:
        """The draft of `conv_id` went out with its files: no longer a draft."""
        self.drafts.forget(conv_id)
        self.attachments.clear()
        self._set("")

    def take_back(self, text: str, documents: Sequence[Document]) -> None:
        """A send the engine refused: its text comes back (unless something new was typed
        meanwhile), and the files sent with it."""
        if not self.text:
            self._set(text)
        if documents:
            self.attachments.set(documents)
            self.jobs.spawn(self.attachments.recount())

    def save(self) -> None:
        """Keep the text as the open conversation's draft, in the store."""
        self.drafts.keep(self.conversation.conv_id, self.text)

    # ------------------------------------------------------------------------------ files
    def attach(self, paths: list[str]) -> "asyncio.Task[Any]":
        """Attach files to the message being written (read off the GUI thread; refusals told);
        a file the conversation has already is not attached again."""
        return self.jobs.spawn(self.attachments.add(paths, already=self.conversation.path_documents()))

    async def _document_tokens(self, document: Document) -> Optional[int]:
        system = self.conversation.settings().system_prompt
        try:
            return await self.jobs.call(lambda engine: token_cost(engine, document, system))
        except Exception:  # no model loaded yet: the chip shows no count until one is
            return None

    # ------------------------------------------------------------------------------ the count
    def recount(self) -> None:
        """Count the next prompt (the path shown + the draft + its files) once changes pause, on the
        engine thread, against the limit in force (the conversation's own, never past the model's),
        then tell it. Called when the draft, the path, the settings or the model change; a count
        overtaken by a newer one is dropped."""
        if self.jobs.closed:
            return
        if self._count_at is not None:
            self._count_at.cancel()
        self._count_at = self.jobs.loop.call_later(COUNT_DELAY_S, self._start_count)

    def _start_count(self) -> None:
        if self.jobs.closed:
            return
        if self._count is not None:
            self._count.cancel()
        self._count = self.jobs.spawn(self._measure())

    async def _measure(self) -> None:
        counted = (self.conversation.conv_id, self.text)
        what = budget_requests(self.conversation.vms, self.text, self.conversation.settings(),
                               self.attachments.documents)  # fmt: skip
        budget: Optional[ContextBudget] = None
        if what is not None:
            try:
                budget = await self.jobs.call(lambda engine: measure_budget(engine, what))
            except asyncio.CancelledError:
                raise
            except Exception:  # no model loaded yet, or one that cannot render these messages
                budget = None
        if self.jobs.closed:
            return
        self.budget, self.budget_for = budget, counted
        self.budget_changed.emit(budget)

    def refusal(self, text: Optional[str] = None) -> str:
        """Why sending `text` (the draft by default) now would be refused ('' when it would not,
        as far as the last count of this conversation and this very text knows): the meter's warning."""
        b = self.budget
        text = self.text if text is None else text
        if b is None or not b.refused or self.budget_for != (self.conversation.conv_id, text):
            return ""
        return b.warning
