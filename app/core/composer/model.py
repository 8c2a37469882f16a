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
from dataclasses import replace
from typing import Any, Optional, Sequence

from psygnal import Signal

from app.core.composer.attachments import Attachments
from app.core.composer.context_budget import ContextBudget, budget_requests, measure_budget
from app.core.composer.drafts import Drafts
from app.core.conversation.model import Conversation
from app.core.engine_link.model import EngineLink
from app.core.jobs import EngineJobs
from engine.documents.extract import Document

Counted = tuple[Optional[int], str, tuple[str, ...]]  # what a count was of: conversation, text, files' digests
PathKey = tuple[Optional[int], tuple[int, ...]]  # a conversation and the ids of its path's finished messages
COUNT_DELAY_S = 0.3  # the next prompt is counted once changes (typing, the path, the model) pause this long


class Composer:
    text_changed = Signal(str)  # the draft's text changed (typed, or set here: the widget shows it)
    budget_changed = Signal(object)  # Optional[ContextBudget]: the next prompt against the limit in force
    queued_changed = Signal(object)  # Optional[str]: a send waiting for its documents to be read and counted

    def __init__(self, jobs: EngineJobs, conversation: Conversation, drafts: Drafts,
                 link: Optional[EngineLink] = None) -> None:  # fmt: skip
        self.jobs, self.conversation, self.drafts = jobs, conversation, drafts
        self.link = link  # the model loaded and the others found: what would hold a draft too long
        self.text = ""
        self.budget: Optional[ContextBudget] = None  # the last count of the next prompt
        self.budget_for: Optional[Counted] = None  # the conversation, text and documents it counted (None: none)
        self.budget_path: PathKey = (None, ())  # the path it counted
        self.queued: Optional[str] = None  # a send's text, waiting for its count (ops.send)
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

    def remove_file(self, index: int) -> None:
        """× on a chip: the file is no longer attached; the others are counted again (the one now
        first may lose the separator before it)."""
        self.attachments.remove(index)
        if self.attachments.items:
            self.jobs.spawn(self.attachments.recount())

    async def _document_tokens(self, document: Document) -> Optional[int]:
        """What `document` costs in the next prompt, as the engine counts it (Engine.document_tokens:
        its block in the system message and the separator before it), placed where it will be:
        after the path's documents and the draft's attached before it."""
        system = self.conversation.settings().system_prompt
        placed = tuple(self.conversation.path_documents()) + self.attachments.documents
        digests = [d.digest for d in placed]
        if document.digest not in digests:
            placed, digests = (document,), [document.digest]
        at = digests.index(document.digest)
        try:
            return (await self.jobs.call(lambda engine: engine.document_tokens(placed, system)))[at]
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
        self._count = self.jobs.spawn(self._measure(self.text))

    def path_changed(self) -> None:
        """The path shown changed: it is counted again. Meanwhile the count of another conversation,
        or of a branch this path does not continue (an edit, another variant), is not shown: the
        meter waits for this path's own (a reply that grows the path, or a regenerate of its last
        reply, keeps it: the numbers stay those of this conversation)."""
        if self.budget_for is not None and not self._continues(self.budget_path):
            self.budget, self.budget_for = None, None
            self.budget_changed.emit(None)
        self.recount()

    def _path(self) -> PathKey:
        return (self.conversation.conv_id, tuple(vm.id for vm in self.conversation.vms if vm.status != "generating"))

    def _continues(self, counted: PathKey) -> bool:
        """Whether the path shown is `counted` or runs along it (one is the start of the other)."""
        (conv, now), (then_conv, then) = self._path(), counted
        return conv == then_conv and (now[: len(then)] == then or then[: len(now)] == now)

    @property
    def counting(self) -> bool:
        """Nothing counted yet for what is shown, and there is something to count."""
        return self.budget_for is None and bool(self.conversation.vms or self.text.strip())

    def _key(self, text: str) -> Counted:
        return (self.conversation.conv_id, text, tuple(d.digest for d in self.attachments.documents))

    def counted(self, text: str) -> bool:
        """Whether the last count is of exactly this: this conversation, `text`, these files."""
        return self.budget_for == self._key(text) and not self.attachments.reading

    def must_count(self, text: str) -> bool:
        """Whether a send of `text` must wait for its count: documents go with it (attached or on
        the path: they are never left out, so nothing else can make room) and the last count is
        not of this very draft, or a file is still being read (it goes with the message)."""
        documents = self.attachments.documents or self.conversation.path_documents() or self.attachments.reading
        return bool(documents) and not self.counted(text)

    async def count_now(self, text: str) -> None:
        """Count `text` now (once the files being read are attached), not waiting for typing to
        pause: a send that must wait for its count (ops.send) is decided by it."""
        self.queue(text)
        try:
            await self.attachments.read()
            if self._count_at is not None:
                self._count_at.cancel()
            if self._count is not None:
                self._count.cancel()
            self._count = self.jobs.spawn(self._measure(text))
            await self._count  # a newer count (typing meanwhile) cancels it, and the send waiting for it
        finally:
            self.queue(None)

    def queue(self, text: Optional[str]) -> None:
        """A send of `text` waits for its count (None: none waits)."""
        if text != self.queued:
            self.queued = text
            self.queued_changed.emit(text)

    async def _measure(self, text: str) -> None:
        counted, path = self._key(text), self._path()
        what = budget_requests(self.conversation.vms, text, self.conversation.settings(),
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
        if budget is not None and budget.refused and self.link is not None:
            budget = self._what_would_hold(budget, self.link)
        self.budget, self.budget_for, self.budget_path = budget, counted, path
        self.budget_changed.emit(budget)

    @staticmethod
    def _what_would_hold(budget: ContextBudget, link: EngineLink) -> ContextBudget:
        """A draft too long for the context in force: the model's own context when the limit is
        the conversation's (Settings), or a model found here whose context would hold it."""
        need = budget.draft + budget.max_tokens
        model = link.info.context_length if link.info is not None else None
        return replace(budget, model_context=model, longer=link.longer_context(need), looked=bool(link.models))

    def refusal(self, text: Optional[str] = None) -> str:
        """Why sending `text` (the draft by default) now would be refused ('' when it would not,
        as far as the last count of this conversation and this very text knows): the meter's warning."""
        b = self.budget
        text = self.text if text is None else text
        if b is None or not b.refused or not self.counted(text):
            return ""
        return b.warning
