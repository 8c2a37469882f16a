"""The context meter's reading before Send: the conversation plus the draft, against the limit
in force, and what Send will do when that does not fit (no Qt).

The engine counts (Engine.measure, on its thread: the tokenizer belongs to the loaded model);
this module says what to count and how to word the result.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Optional, Sequence

from engine.documents.extract import Document
from engine.types import GenerationRequest

if TYPE_CHECKING:
    from engine.bridge import EngineAPI
    from app.core.store.settings import ChatSettings
    from app.core.conversation.view_models import MessageVM


def short_count(n: int) -> str:
    """'6,920', '13.5k': short enough for the meter beside the composer."""
    return f"{n / 1000:.1f}k" if n >= 10_000 else f"{n:,}"


@dataclass(frozen=True)
class BudgetRequests:
    """What to count: the next prompt (the active path, then the draft as a user turn, with the
    documents of both), and the draft alone (with the system prompt and every document): the part
    that leaving out old turns cannot shorten (documents are never left out)."""

    full: GenerationRequest
    alone: Optional[GenerationRequest]  # None: no draft
    max_tokens: int
    policy: str  # the conversation's context policy: "truncate" | "refuse"
    documents: tuple[Document, ...] = ()


def budget_requests(vms: Sequence["MessageVM"], draft: str, settings: "ChatSettings",
                    attached: Sequence[Document] = ()) -> Optional[BudgetRequests]:  # fmt: skip
    """None when there is nothing to count (an empty chat and an empty draft). `attached`: the
    files attached to the draft (the path's own documents come with its messages)."""
    system = [{"role": "system", "content": settings.system_prompt}] if settings.system_prompt else []
    turns = [{"role": vm.role, "content": vm.content} for vm in vms
             if vm.role in ("user", "assistant") and vm.status != "generating"]  # fmt: skip
    documents = tuple(d for vm in vms for d in vm.documents) + tuple(attached)
    mine = [{"role": "user", "content": draft}] if draft.strip() else []
    if not turns and not mine:
        return None
    base = GenerationRequest(messages=system + turns + mine, sampler=settings.sampler,
                             context_length=settings.context_length or None, documents=documents)  # fmt: skip
    alone = replace(base, messages=system + mine) if mine else None
    return BudgetRequests(base, alone, settings.sampler.max_tokens, settings.context_policy, documents)


@dataclass(frozen=True)
class ContextBudget:
    """The next prompt's size against the context in force (the per-conversation limit when set,
    never more than the model's)."""

    used: int  # tokens of the next prompt: the conversation + the draft
    limit: Optional[int]  # None: the model does not say
    max_tokens: int  # the reply may take up to this many more
    policy: str = "truncate"
    draft: int = 0  # tokens of the draft alone with the system prompt and the documents (0: no draft)
    documents: int = 0  # tokens the documents add (the path's and the draft's)
    pages: int = 0  # pages of the PDFs among them (what "fewer pages" counts)
    # Only for a draft too long (Composer): the loaded model's own context, and a model found
    # on this machine whose context would hold the draft and the reply (name, context).
    model_context: Optional[int] = None
    longer: Optional[tuple[str, int]] = None
    looked: bool = False  # the models found here were looked through (`longer` None: none holds it)

    @property
    def fits(self) -> bool:
        return self.limit is None or self.used + self.max_tokens <= self.limit

    @property
    def refused(self) -> bool:
        """Send would be refused: the draft does not fit and leaving old turns out cannot make
        room (the draft alone is too long, or the conversation's policy is refuse)."""
        if self.fits or not self.draft or self.limit is None:
            return False
        return self.draft + self.max_tokens > self.limit or self.policy == "refuse"

    @property
    def fraction(self) -> float:
        return min(self.used / self.limit, 1.0) if self.limit else 0.0

    @property
    def text(self) -> str:
        """The meter's label: '6,920 / 8,192'."""
        return f"{short_count(self.used)} / {short_count(self.limit)}" if self.limit else short_count(self.used)

    @property
    def tooltip(self) -> str:
        what = "this conversation and your draft" if self.draft else "this conversation"
        if self.documents:
            what += f" (documents: {self.documents:,})"
        limit = f"of the {self.limit:,}-token context in force" if self.limit else "(the model's context is unknown)"
        return (f"Context: {self.used:,} tokens for {what}, {limit};"
                f" the reply may add up to {self.max_tokens:,} more")

    @property
    def warning(self) -> str:
        """What Send will do with a draft that does not fit ('' when it fits or there is no draft)."""
        if self.fits or not self.draft or self.limit is None:
            return ""
        need = f"{self.used:,} tokens + up to {self.max_tokens:,} for the reply > the {self.limit:,}-token context"
        if self.draft + self.max_tokens > self.limit:
            head = (f"Too long: this message alone needs {self.draft:,} tokens + up to {self.max_tokens:,} for"
                    f" the reply, more than the {self.limit:,}-token context. Send will be refused: ")
            room = self.limit - self.draft  # what is left for the reply once the message is in
            if self.documents:
                return self._documents_advice()
            if room < 1:  # the message alone fills the context: no max tokens can make it fit
                return head + "shorten the message, or use a model (or a context limit) with a longer context."
            return head + f"shorten it, or lower max tokens in Settings to {room:,} or less."
        if self.policy == "refuse":
            return (f"Will not fit: {need}. Send will be refused (this conversation's context policy"
                    " is refuse; Settings can leave the oldest turns out instead).")
        return f"Will not fit: {need}. Send will leave the oldest turns out of the prompt."

    @property
    def documents_refused(self) -> bool:
        """Send is refused because of the documents: with them the message alone does not fit."""
        return bool(self.documents) and self.limit is not None and self.draft + self.max_tokens > self.limit

    @property
    def room_for_documents(self) -> int:
        """Tokens of documents that fit beside the system prompt, the message and the reply."""
        assert self.limit is not None
        return max(self.limit - self.max_tokens - (self.draft - self.documents), 0)

    def document_note(self, tokens: Optional[int], pages: Optional[int], others: bool) -> str:
        """What a document's chip says when the documents make Send refused ('' otherwise): how
        much would fit (pages of a PDF). `others`: other documents go with it."""
        if not self.documents_refused or tokens is None:
            return ""
        room = self.room_for_documents
        if tokens <= room:
            return f"with the others, more than the {room:,} tokens of documents that fit"
        if pages and room:
            keep = int(room / (tokens / pages))
            if keep >= 1:
                return f"too long: about {keep} of its {pages} pages fit"
        return f"too long: {room:,} tokens of documents fit" + (" in all" if others else "")

    def _documents_advice(self) -> str:
        """The documents make the message too long: what would fit instead (never truncated)."""
        assert self.limit is not None
        head = (f"Too long: the documents ({self.documents:,} tokens) and this message need {self.draft:,}"
                f" tokens + up to {self.max_tokens:,} for the reply, more than the {self.limit:,}-token"
                " context. Send will be refused (documents are never cut): ")
        over = self.draft + self.max_tokens - self.limit
        ways = []
        if self.pages and self.documents > over:
            per_page = self.documents / self.pages
            keep = int((self.documents - over) / per_page)
            if keep >= 1:
                ways.append(f"attach about {keep} of the {self.pages} pages")
        ways.append("remove a document")
        ways.append(self._longer_context())
        return head + ", ".join(ways[:-1]) + ", or " + ways[-1] + "."

    def _longer_context(self) -> str:
        """What would hold the draft: the model's own context when the limit in force is the
        conversation's (Settings), else a model found on this machine whose context would."""
        assert self.limit is not None
        need = self.draft + self.max_tokens
        if self.model_context and self.model_context > self.limit and need <= self.model_context:
            return (f"raise this conversation's context limit in Settings (the model holds {self.model_context:,}"
                    " tokens)")
        if self.longer is not None:
            name, context = self.longer
            return f"use a model with a longer context: {name} holds {context:,} tokens"
        return "use a model with a longer context" + (" (none found on this computer holds it)" if self.looked else "")


def refusal_text(prompt_tokens: int, max_tokens: int, limit: int, conversation_limit: Optional[int],
                 model_context: Optional[int]) -> str:
    """Why the engine refused a send (ContextLengthError), naming whose limit it is: the
    conversation's own (Settings) or the model's."""
    if conversation_limit and conversation_limit == limit and model_context != limit:
        whose = f"this conversation's {limit:,}-token context limit (Settings"
        whose += f"; the model's own is {model_context:,})" if model_context else ")"
    else:
        whose = f"the model's {limit:,}-token context"
    return (f"Not sent: the prompt needs {prompt_tokens:,} tokens + up to {max_tokens:,} for the reply,"
            f" more than {whose}. What you typed is back in the composer.")


def measure_budget(engine: "EngineAPI", what: BudgetRequests) -> ContextBudget:
    """On the engine thread: the whole next prompt, and the draft alone (Engine.measure)."""
    full = engine.measure(what.full)
    alone = engine.measure(what.alone).prompt_tokens if what.alone is not None else 0
    docs = 0
    if what.documents:  # the sum of each one's cost, as its chip, the report and a refusal count it
        first = what.full.messages[0] if what.full.messages else {}
        system = str(first.get("content", "")) if first.get("role") == "system" else ""
        docs = sum(engine.document_tokens(tuple(what.documents), system))
    pages = sum(d.pages or 0 for d in what.documents)
    return ContextBudget(full.prompt_tokens, full.limit, what.max_tokens, what.policy, alone, docs, pages)
