"""A reply's life in the store, without Qt: begun (the user's message and the reply's row
committed first, the seed chosen once, the request built), finished (the reply, how it compares,
its run), failed or taken back; receipts and what a cold run must reproduce.

Everything here goes through `engine` APIs (the conversation store and the request types), so a
test can drive a whole chat without a GUI. The operations (app/core/ops.py) call `begin_*` on
the GUI thread and hand the returned `PendingReply` (frozen: nobody changes it afterwards) to the
generation; the engine thread calls `finish` / `fail` (the store is thread-safe), so a reply is
saved even if the window is closing. `finish` returns what it saved as a `SavedReply`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence

from app.core.store.conversations import ConversationStore
from app.core.store.records import (
    Action,
    Message,
    ReplyOutcome,
    Run,
    StoreError,
    assistant_fields_from_result,
    continuable,
)
from app.core.store.settings import ChatSettings, fresh_seed
from engine.documents.extract import Document
from engine.types import (
    CacheReport,
    Comparison,
    Continuation,
    GenerationRequest,
    GenerationResult,
    SamplerSettings,
)

DEFAULT_TITLE = "New conversation"
TITLE_CHARS = 48



@dataclass(frozen=True)
class ModelIdentity:
    """The loaded model as a receipt names it (engine ModelInfo + the spec it was loaded by)."""

    spec: str
    key: str
    name: str = ""
    dequantized: Optional[bool] = None
    environment: Optional[dict[str, str]] = None  # where it runs, when not this process (a server)


@dataclass(frozen=True)
class ReplyMaker:
    """The model that makes a reply, as the reply's row and its receipts name it: the name shown,
    its key (what a regenerate and a receipt check), the prefill chunk of the engine that runs it."""

    name: Optional[str] = None
    key: str = ""
    chunk: int = 0


@dataclass(frozen=True)
class PendingReply:
    """A reply row created up front (status "generating") and the request that fills it. Frozen:
    what `finish` saves comes back as a SavedReply, never written into this."""

    conversation_id: int
    user_id: int  # the message the reply answers
    reply_id: int
    request: GenerationRequest
    action: Action
    previous_id: Optional[int] = None  # the variant this reply was made to replace
    maker: ReplyMaker = ReplyMaker()  # what a reply saved before it ends needs to be replayed
    hidden: int = 0  # later turns a regenerate of a middle reply leaves with the previous variant
    earlier_text: str = ""  # a Continue: the reply's text so far (app/core/generation/continuing.py)

    @property
    def model_name(self) -> Optional[str]:
        return self.maker.name

    @property
    def model_key(self) -> str:
        return self.maker.key

    @property
    def chunk(self) -> int:
        return self.maker.chunk


@dataclass(frozen=True)
class SavedReply:
    """What `finish` saved: the message (the new reply, or the variant it turned out identical
    to: then no copy was added and `duplicate_of` names that variant), how it compares, its run."""

    message: Message
    outcome: ReplyOutcome
    run: Run
    duplicate_of: Optional[int] = None


def choose_seed(action: Action, settings: ChatSettings, own: Optional[int] = None) -> int:
    """A reply's seed, chosen here and nowhere else: a regenerate or a Continue keeps the reply's
    own (`own`, else the settings'), a new variant draws a fresh one, anything else follows the
    conversation's settings (a fresh seed unless they fix one)."""
    if action in (Action.REGENERATE, Action.CONTINUE):
        return own if own is not None else settings.sampler.seed
    if action is Action.VARIANT:
        return fresh_seed()
    return settings.seed_for_new_reply()


class ChatSession:
    """The chat operations of one data dir, over a `ConversationStore`."""

    def __init__(self, store: ConversationStore) -> None:
        self.store = store

    def close(self) -> None:
        self.store.close()

    # -- conversations -------------------------------------------------------------------------
    def new_conversation(self, settings: ChatSettings, title: str = DEFAULT_TITLE) -> int:
        return self.store.create_conversation(title, settings.to_dict()).id

    def settings(self, conv_id: int) -> ChatSettings:
        return ChatSettings.from_dict(self.store.get_conversation(conv_id).settings)

    def set_settings(self, conv_id: int, settings: ChatSettings) -> None:
        self.store.set_settings(conv_id, settings.to_dict())


    def title(self, conv_id: int) -> str:
        return self.store.get_conversation(conv_id).title

    def rename(self, conv_id: int, title: str) -> None:
        self.store.rename_conversation(conv_id, title)

    def delete_conversation(self, conv_id: int) -> None:
        self.store.delete_conversation(conv_id)

    def export(self, conv_id: int, as_json: bool, model: Optional[ModelIdentity] = None) -> str:
        """The whole tree as Verbatim JSON (re-importable), or the active path as Markdown. With
        the loaded model's identity, every reply with tokens carries its receipt ("receipt")."""
        if not as_json:
            return self.store.export_markdown(conv_id)
        text = self.store.export_json(conv_id)
        if model is None:
            return text
        doc = json.loads(text)
        ids = [m.id for m in self.store.messages(conv_id)]  # the file's ids are 1..n in this order
        for entry, mid in zip(doc["messages"], ids):
            if entry.get("role") == "assistant" and entry.get("tokens"):
                try:
                    entry["receipt"] = self.receipt(mid, model).to_dict()
                except (StoreError, ValueError):
                    pass
        return json.dumps(doc, indent=1, ensure_ascii=False)

    def import_conversation(self, data: bytes) -> int:
        return self.store.import_json(data).id

    # -- messages ------------------------------------------------------------------------------
    def show_variant(self, message_id: int) -> None:
        """Make a message (a reply variant or an edit branch) the active one among its siblings."""
        self.store.set_active(message_id)

    def has_followers(self, message_id: int) -> bool:
        return bool(self.store.children(message_id))

    def delete_message(self, message_id: int) -> None:
        """Delete a message and everything below it."""
        self.store.delete_message(message_id)

    def message(self, message_id: int) -> Message:
        return self.store.get_message(message_id)

    def draft_messages(self, conv_id: Optional[int], draft: str, settings: ChatSettings) -> list[dict[str, str]]:
        """What a send of `draft` would give the engine: the active path and the draft (a new
        conversation: the system prompt of `settings` and the draft)."""
        path = self.store.active_path(conv_id) if conv_id is not None else []
        if path:
            messages = self.store.messages_for_prompt(conv_id, path[-1].id)  # type: ignore[arg-type]
        else:
            messages = [{"role": "system", "content": settings.system_prompt}] if settings.system_prompt else []
        return messages + [{"role": "user", "content": draft}]

    # -- starting a reply ----------------------------------------------------------------------
    def begin_send(
        self, conv_id: Optional[int], text: str, maker: ReplyMaker = ReplyMaker(),
        new_settings: Optional[ChatSettings] = None, documents: Sequence[Document] = (),
    ) -> PendingReply:  # fmt: skip
        """Save the user's message (with the `documents` attached to it) and a reply placeholder,
        in one transaction (one commit, one fsync) with the conversation itself when `conv_id` is
        None (made with `new_settings`); committed before anything is generated."""
        if not text.strip():
            raise StoreError("cannot send an empty message")
        with self.store.transaction():
            if conv_id is None:
                conv_id = self.new_conversation(new_settings or ChatSettings())
            conv = self.store.get_conversation(conv_id)
            path = self.store.active_path(conv_id)
            parent = path[-1].id if path else None
            user = self.store.add_message(conv_id, parent, "user", text, documents=documents)
            if conv.title == DEFAULT_TITLE and not path:
                self.store.rename_conversation(conv_id, title_from(text))
            return self._begin_reply(conv_id, user.id, self.settings(conv_id), Action.SEND, maker)

    def begin_regenerate(self, reply_id: int, fresh: bool = False, maker: ReplyMaker = ReplyMaker()) -> PendingReply:
        """Another variant of `reply_id`. Regenerate (fresh=False) reuses the reply's own seed,
        sampler and mode, so it must reproduce it; a new variant (fresh=True) takes the
        conversation's current settings and a fresh seed."""
        reply = self.store.get_message(reply_id)
        if reply.role != "assistant" or reply.parent_id is None:
            raise StoreError("only an assistant reply can be regenerated")
        settings = self.settings(reply.conversation_id)
        if fresh:
            return self._begin_reply(reply.conversation_id, reply.parent_id, settings, Action.VARIANT, maker, reply_id)
        sampler = SamplerSettings.from_dict(reply.sampler or {}) if reply.sampler else settings.sampler
        mode = reply.report.mode if reply.report is not None else settings.mode
        settings = replace(settings, sampler=sampler, mode=mode)
        return self._begin_reply(reply.conversation_id, reply.parent_id, settings, Action.REGENERATE, maker, reply_id,
                                 own_seed=reply.seed)

    def begin_reply_to(self, user_id: int, maker: ReplyMaker = ReplyMaker()) -> PendingReply:
        """A reply to a user message that has none (its generation failed or was deleted)."""
        user = self.store.get_message(user_id)
        if user.role != "user":
            raise StoreError("a reply must answer a user message")
        settings = self.settings(user.conversation_id)
        return self._begin_reply(user.conversation_id, user.id, settings, Action.RETRY, maker)

    def begin_edit(self, user_id: int, text: str, maker: ReplyMaker = ReplyMaker()) -> PendingReply:
        """Edit a user message as a branch (the original stays a variant) and answer the edit."""
        if not text.strip():
            raise StoreError("cannot send an empty message")
        edited = self.store.edit_message(user_id, text)
        settings = self.settings(edited.conversation_id)
        return self._begin_reply(edited.conversation_id, edited.id, settings, Action.EDIT, maker)

    def begin_continue(self, reply_id: int, maker: ReplyMaker = ReplyMaker()) -> PendingReply:
        """The reply `reply_id`, marked generating again, and the request that continues it in
        place (app/core/generation/continuing.py): its own seed, sampler and mode; a reply that
        ended at max tokens gets the conversation's max tokens again, counted from where it ended
        (max_tokens counts the whole reply); a stopped one keeps its own."""
        reply = self.store.get_message(reply_id)
        if reply.role != "assistant" or reply.parent_id is None:
            raise StoreError("only an assistant reply can be continued")
        tokens = list(reply.tokens or [])
        if not continuable(reply.status, reply.finish_reason, len(tokens)):
            raise StoreError("this reply ended on its own (or has no tokens): there is nothing to continue")
        settings = self.settings(reply.conversation_id)
        sampler = SamplerSettings.from_dict(reply.sampler or {}) if reply.sampler else settings.sampler
        own = reply.seed if reply.seed is not None else sampler.seed
        sampler = replace(sampler, seed=choose_seed(Action.CONTINUE, settings, own))
        if reply.status == "complete":  # ended at max tokens: as many again
            sampler = replace(sampler, max_tokens=len(tokens) + settings.sampler.max_tokens)
        mode = reply.report.mode if reply.report is not None else settings.mode
        request = GenerationRequest(
            messages=self.store.messages_for_prompt(reply.conversation_id, reply.parent_id), sampler=sampler,
            mode=mode,  # type: ignore[arg-type]
            context_policy=settings.context_policy,  # type: ignore[arg-type]
            context_length=settings.context_length or None,
            continuation=Continuation(tuple(tokens), logprobs=tuple(reply.logprobs or ())),
            documents=self.store.documents_for_prompt(reply.parent_id),
        )
        self.store.update_message(reply_id, status="generating", sampler=sampler.to_dict())
        return PendingReply(reply.conversation_id, reply.parent_id, reply_id, request, Action.CONTINUE, None, maker,
                            earlier_text=reply.content)

    def _begin_reply(
        self, conv_id: int, user_id: int, settings: ChatSettings, action: Action, maker: ReplyMaker,
        previous_id: Optional[int] = None, own_seed: Optional[int] = None,
    ) -> PendingReply:  # fmt: skip
        seed = choose_seed(action, settings, own_seed)
        sampler = replace(settings.sampler, seed=seed)
        messages = self.store.messages_for_prompt(conv_id, user_id)
        request = GenerationRequest(messages=messages, sampler=sampler, mode=settings.mode,  # type: ignore[arg-type]
                                    context_policy=settings.context_policy,  # type: ignore[arg-type]
                                    context_length=settings.context_length or None,
                                    documents=self.store.documents_for_prompt(user_id))
        reply = self.store.add_message(
            conv_id, user_id, "assistant", "", status="generating",
            seed=seed, sampler=sampler.to_dict(), model_name=maker.name,
        )  # fmt: skip
        return PendingReply(conv_id, user_id, reply.id, request, action, previous_id, maker)

    # -- ending a reply ------------------------------------------------------------------------
    def save_partial(self, pending: PendingReply, text: str, tokens: list[int], logprobs: list[float]) -> None:
        """What streamed so far, text with its tokens and logprobs (crash safety for long replies):
        a reply cut short by a crash keeps its tokens, so it can be inspected, verified and
        compared with its regenerate. Its report says how to replay it (no run yet: "streamed")."""
        req = pending.request
        report = {"streamed": True, "mode": req.mode, "seed": req.sampler.seed, "sampler": req.sampler.to_dict(),
                  "model_key": pending.model_key, "chunk_size": pending.chunk or CacheReport().chunk_size,
                  "action": str(pending.action), "previous_id": pending.previous_id}
        self.store.update_message(pending.reply_id, content=text, tokens=list(tokens), logprobs=list(logprobs),
                                  model_key=pending.model_key or None, cache_report=report)

    def finish(self, pending: PendingReply, result: GenerationResult) -> SavedReply:
        """Store the reply with its tokens, logprobs and report, and its identity with the variant
        it replaces (compared on stored tokens and logprobs, so it holds across restarts).

        Regenerate compares with its source reply (over the source's length when that one was
        stopped); a new variant (new seed) is compared with nothing. A regenerate or new variant
        identical to an existing variant (same tokens, bit-equal logprobs) adds no copy: its row is
        dropped, that variant is made active and saved with this run (`duplicate_of` names it)."""
        comparison = None if pending.action is Action.VARIANT else self.compare_with_previous(pending.previous_id, result)
        outcome = ReplyOutcome(pending.action, pending.previous_id, comparison,
                               world_sizes=self._world_sizes(pending.previous_id, result, comparison))
        twin = self.identical_variant(pending, result)
        with self.store.transaction():  # the reply and its run: one commit
            if twin is not None:  # this generation becomes a run of the variant it equals
                outcome = replace(outcome, duplicate_of=twin.id)
                self.store.delete_message(pending.reply_id)
                self.store.set_active(twin.id)
                message = twin
            else:
                fields = assistant_fields_from_result(result, outcome)
                status = "interrupted" if result.finish_reason == "cancelled" else "complete"
                if pending.model_name:
                    fields["model_name"] = pending.model_name
                message = self.store.update_message(pending.reply_id, content=result.text, status=status, **fields)
            run = self.store.add_run(message.id, result.seed, result.finish_reason, len(result.tokens),
                                     result.report.to_dict(), outcome.to_dict())
        return SavedReply(message, outcome, run, twin.id if twin is not None else None)

    def identical_variant(self, pending: PendingReply, result: GenerationResult) -> Optional[Message]:
        """A complete sibling of a regenerate / new variant with the same tokens and bit-equal logprobs."""
        if pending.action not in (Action.REGENERATE, Action.VARIANT) or result.finish_reason == "cancelled":
            return None
        try:
            siblings = self.store.siblings(pending.reply_id)
        except StoreError:
            return None
        for m in siblings:
            if (m.id != pending.reply_id and m.status == "complete" and m.tokens == list(result.tokens)
                    and m.logprobs == list(result.logprobs)):
                return m
        return None

    def compare_with_previous(self, previous_id: Optional[int], result: GenerationResult) -> Optional[Comparison]:
        """The new reply against the one it regenerates: in full, or over the shared length when
        the previous one was stopped (identical up to where it stopped), or over the new one's
        when it is the one stopped (identical as far as it got)."""
        stopped = result.finish_reason == "cancelled"
        if previous_id is None or (stopped and not result.tokens):
            return None
        try:
            prev = self.store.get_message(previous_id)
        except StoreError:  # deleted meanwhile
            return None
        if prev.tokens is None or prev.status == "generating":
            return None
        if prev.status != "complete" or stopped:  # one was stopped: compare what both generated
            if not prev.tokens:
                return None
            return Comparison.of(prev.tokens, prev.logprobs or [], result.tokens, result.logprobs, prev.content,
                                 result.text, shared_length=True)
        return Comparison.of(prev.tokens, prev.logprobs or [], result.tokens, result.logprobs, prev.content, result.text)

    def _world_sizes(self, previous_id: Optional[int], result: GenerationResult,
                     comparison: Optional[Comparison]) -> Optional[tuple[int, int]]:  # fmt: skip
        """The two world sizes when a regenerate that is not identical ran on another number of
        ranks than the reply it regenerates (the likely cause); None otherwise."""
        if comparison is None or comparison.identical or previous_id is None:
            return None
        try:
            prev = self.store.get_message(previous_id).report
        except StoreError:
            return None
        before, now = (prev.world_size if prev is not None else 1), result.report.world_size
        return (before, now) if before != now else None

    def withdraw(self, pending: PendingReply) -> bool:
        """Take back a send the engine refused: its user message (and the placeholder) leave
        the conversation; the conversation too if that message was its only one (True then)."""
        with self.store.transaction():
            self.store.delete_message(pending.user_id)
            if self.store.messages(pending.conversation_id):
                return False
            self.store.delete_conversation(pending.conversation_id)
            return True

    def fail(self, pending: PendingReply, keep_text: str = "") -> None:
        """A generation that raised: drop an empty placeholder (the user's message stays), keep
        any streamed text as an interrupted reply."""
        try:
            if keep_text or pending.action is Action.CONTINUE:  # a Continue keeps the reply it went on with
                self.store.update_message(pending.reply_id, content=keep_text or pending.earlier_text,
                                          status="interrupted")
            else:
                self.store.delete_message(pending.reply_id)
        except StoreError:
            pass

    # -- receipts and compare ------------------------------------------------------------------
    def receipt(self, reply_id: int, model: ModelIdentity, env: Optional[dict[str, str]] = None) -> Any:
        """A stored reply's receipt (engine/receipts.py): `python -m engine verify` replays it.
        The model's spec goes in only when the loaded model is the one that made the reply."""
        from engine.receipts import ReceiptError, ReceiptModel, build

        reply = self.store.get_message(reply_id)
        if reply.role != "assistant" or reply.parent_id is None or not reply.tokens:
            raise StoreError("this reply has no tokens: there is nothing to replay")
        report = reply.report or CacheReport()
        sampler = SamplerSettings.from_dict(reply.sampler or {})
        if reply.seed is not None:
            sampler = replace(sampler, seed=reply.seed)
        mode = report.mode if report.mode in ("exact", "fast") else "exact"
        request = GenerationRequest(self.store.messages_for_prompt(reply.conversation_id, reply.parent_id),
                                    sampler, mode=mode,  # type: ignore[arg-type]
                                    documents=self.store.documents_for_prompt(reply.parent_id))
        result = reply.as_result()
        key = reply.model_key or report.model_key
        same = bool(key) and key == model.key
        ident = ReceiptModel(model.spec if same else "", key or model.key, reply.model_name or model.name,
                             model.dequantized if same else None)
        try:
            return build(request, result, ident, report.chunk_size, env if env is not None else model.environment)
        except ReceiptError as e:
            raise StoreError(str(e)) from e

    def compare_candidates(self, reply_id: int) -> list[tuple[Message, str]]:
        """The replies of the same prompt (the reply's variants) that have tokens, with labels."""
        siblings = self.store.siblings(reply_id)
        n = len(siblings)
        return [(m, f"Reply {i + 1} / {n}") for i, m in enumerate(siblings)
                if m.role == "assistant" and m.tokens and m.status != "generating"]

    # -- verify --------------------------------------------------------------------------------
    def verify_inputs(self, reply_id: int) -> tuple[GenerationRequest, list[int], list[float]]:
        """The request that produced a stored reply, and its tokens / logprobs: what a cold run
        must reproduce."""
        reply = self.store.get_message(reply_id)
        if reply.role != "assistant" or reply.parent_id is None or reply.tokens is None:
            raise StoreError("this reply has no stored tokens to verify")
        sampler = SamplerSettings.from_dict(reply.sampler or {})
        if reply.seed is not None:
            sampler = replace(sampler, seed=reply.seed)
        if reply.status != "complete":  # a stopped reply: check the part that was generated
            if not reply.tokens:
                raise StoreError("this reply was stopped before its first token; nothing to verify")
            sampler = replace(sampler, max_tokens=len(reply.tokens))
        mode = reply.report.mode if reply.report is not None else "exact"
        messages = self.store.messages_for_prompt(reply.conversation_id, reply.parent_id)
        # Leave out what the reply's own prompt left out (a stopped reply is verified with fewer
        # max tokens, which must not change what fits).
        dropped = reply.report.context.dropped_messages if reply.report and reply.report.context else 0
        lead = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
        messages = messages[:lead] + messages[lead + dropped:]
        limit = reply.report.context.limit if reply.report and reply.report.context else None
        request = GenerationRequest(messages=messages, sampler=sampler, mode=mode, context_policy="truncate",
                                    context_length=limit, documents=self.store.documents_for_prompt(reply.parent_id))
        return request, list(reply.tokens), list(reply.logprobs or [])


def title_from(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"
