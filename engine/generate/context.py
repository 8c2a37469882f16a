"""Fitting a conversation into the model's context: refuse, or leave out the oldest turns.

Past its context length a RoPE model produces garbage without any error, so a request never
runs past it. The "truncate" policy drops whole turns from the oldest on (the leading system
messages and the last message always stay), choosing the fewest that make prompt + max_tokens
fit; the choice depends only on the conversation, so a regenerate is instant and identical.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from engine.errors import ContextLengthError
from engine.types import ContextPolicy, Message


@dataclass
class Fitted:
    messages: list[Message]  # what is sent to the model
    prompt: list[int]
    dropped: int  # oldest messages left out


def fit_to_context(
    render: Callable[[list[Message]], list[int]],
    messages: Sequence[Message],
    max_tokens: int,
    limit: Optional[int],
    policy: ContextPolicy,
) -> Fitted:
    messages = list(messages)
    prompt = render(messages)
    if limit is None or len(prompt) + max_tokens <= limit:
        return Fitted(messages, prompt, 0)
    if policy != "truncate":
        raise ContextLengthError(len(prompt), max_tokens, limit)
    lead = 0
    while lead < len(messages) - 1 and messages[lead]["role"] == "system":
        lead += 1
    body = messages[lead:-1]
    # Cut points: drop body[:k] where the rest starts with a user turn (templates want the
    # user/assistant alternation), or everything. Fewer tokens the more is dropped.
    ks = [k for k in range(1, len(body)) if body[k]["role"] == "user"] + [len(body)]
    tried: dict[int, list[int]] = {}

    def tokens(k: int) -> list[int]:
        if k not in tried:
            tried[k] = render(messages[:lead] + body[k:] + messages[-1:])
        return tried[k]

    def fits(k: int) -> bool:
        return len(tokens(k)) + max_tokens <= limit

    if not fits(ks[-1]):
        raise ContextLengthError(len(tokens(ks[-1])), max_tokens, limit,
                                 " (even with only the system prompt and the last message)")
    k = ks[bisect.bisect_left(ks, True, key=fits)]  # the fewest dropped that fit
    return Fitted(messages[:lead] + body[k:] + messages[-1:], tokens(k), k)
