"""Continue: a reply that was stopped (or ended at max tokens) goes on in place.

The engine continues a reply exactly (engine/generate/loop.py, `earlier`): with the reply's own
seed and settings, the new tokens are the ones the reply that was never stopped decoded next,
bit for bit, in exact mode. The request that does it is begun with every other reply's
(ChatSession.begin_continue, app/core/store/session.py); here, the reply so far it streams on
from (`earlier_of`) and the whole reply (the reply so far, then the new part) that replaces the
row (`whole_result`).
"""

from __future__ import annotations

from dataclasses import replace

from app.core.store import Action
from app.core.store.session import PendingReply
from engine.types import GenerationResult

def earlier_of(pending: PendingReply) -> tuple[list[int], list[float]]:
    """The tokens and logprobs of the reply so far ([], [] for anything but a Continue)."""
    c = pending.request.continuation
    if pending.action is not Action.CONTINUE or c is None:
        return [], []
    return list(c.tokens), list(c.logprobs)


def whole_result(pending: PendingReply, result: GenerationResult) -> GenerationResult:
    """A Continue's result as the whole reply: the reply so far, then what the engine added (its
    text after the characters of the reply so far it keeps); anything else as it is."""
    if pending.action is not Action.CONTINUE:
        return result
    tokens, logprobs = earlier_of(pending)
    r = result.report
    kept = r.continued_chars if r.continued_from else len(pending.earlier_text)
    return replace(result, tokens=tokens + list(result.tokens), logprobs=logprobs + list(result.logprobs),
                   text=pending.earlier_text[:kept] + result.text)
