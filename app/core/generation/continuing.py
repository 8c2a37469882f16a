"""Continue: a reply that was stopped (or ended at max tokens) goes on in place.

The engine continues a reply exactly (engine/generate/loop.py, `earlier`): with the reply's own
seed and settings, the new tokens are the ones the reply that was never stopped decoded next,
bit for bit, in exact mode. Here the app's side: the request that does it (`begin_continue`), and
the whole reply (the reply so far, then the new part) that replaces the row (`whole_result`). A
reply that ended at max tokens is given the conversation's max tokens again, counted from where
it ended (max_tokens counts the whole reply); a stopped one keeps its own.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from app.core.session import ChatSession, PendingReply
from app.core.store import StoreError
from app.core.conversation.view_models import can_continue
from engine.types import Continuation, GenerationRequest, GenerationResult, SamplerSettings

CONTINUE = "continue"  # PendingReply.action of a Continue


def begin_continue(session: ChatSession, reply_id: int, model_name: Optional[str] = None) -> PendingReply:
    """The reply `reply_id`, marked generating again, and the request that continues it."""
    store = session.store
    reply = store.get_message(reply_id)
    if reply.role != "assistant" or reply.parent_id is None:
        raise StoreError("only an assistant reply can be continued")
    tokens = list(reply.tokens or [])
    if not can_continue(reply.status, reply.finish_reason, len(tokens)):
        raise StoreError("this reply ended on its own (or has no tokens): there is nothing to continue")
    settings = session.settings(reply.conversation_id)
    sampler = SamplerSettings.from_dict(reply.sampler or {}) if reply.sampler else settings.sampler
    if reply.seed is not None:
        sampler = replace(sampler, seed=reply.seed)
    if reply.status == "complete":  # ended at max tokens: as many again
        sampler = replace(sampler, max_tokens=len(tokens) + settings.sampler.max_tokens)
    mode = reply.report.mode if reply.report is not None else settings.mode
    request = GenerationRequest(
        messages=store.messages_for_prompt(reply.conversation_id, reply.parent_id), sampler=sampler,
        mode=mode,  # type: ignore[arg-type]
        context_policy=settings.context_policy,  # type: ignore[arg-type]
        context_length=settings.context_length or None,
        continuation=Continuation(tuple(tokens), logprobs=tuple(reply.logprobs or ())),
        documents=store.documents_for_prompt(reply.parent_id),
    )
    store.update_message(reply_id, status="generating", sampler=sampler.to_dict())
    pending = PendingReply(reply.conversation_id, reply.parent_id, reply_id, request, CONTINUE, None, model_name)
    pending.earlier_text = reply.content
    return pending


def earlier_of(pending: PendingReply) -> tuple[list[int], list[float]]:
    """The tokens and logprobs of the reply so far ([], [] for anything but a Continue)."""
    c = pending.request.continuation
    if pending.action != CONTINUE or c is None:
        return [], []
    return list(c.tokens), list(c.logprobs)


def whole_result(pending: PendingReply, result: GenerationResult) -> GenerationResult:
    """A Continue's result as the whole reply: the reply so far, then what the engine added (its
    text after the characters of the reply so far it keeps); anything else as it is."""
    if pending.action != CONTINUE:
        return result
    tokens, logprobs = earlier_of(pending)
    r = result.report
    kept = r.continued_chars if r.continued_from else len(pending.earlier_text)
    return replace(result, tokens=tokens + list(result.tokens), logprobs=logprobs + list(result.logprobs),
                   text=pending.earlier_text[:kept] + result.text)
