"""Fitting a conversation into the model's context: refuse, or leave out the oldest turns.

Past its context length a RoPE model produces garbage without any error, so a request never
runs past it. The "truncate" policy drops whole turns from the oldest on (the leading system
messages and the last message always stay); the choice depends only on the conversation, so a
regenerate is instant and identical.

It drops in blocks of about a quarter of the context: the places it may cut are where the
dropped turns first pass 1/4, 2/4, ... of the limit, counted from the oldest message, so they
do not move as the chat grows. The next turns then leave out the same messages (the prompt
keeps its prefix, and the prompt cache its use) until the chat has grown by about a quarter of
the context, instead of changing the start of the prompt on every turn.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from engine.errors import ContextLengthError
from engine.generate.templating import Rendered
from engine.types import ContextPolicy, Message


@dataclass
class Fitted:
    messages: list[Message]  # what is sent to the model
    rendered: Rendered  # their prompt: token ids and the template's text
    dropped: int  # oldest messages left out

    @property
    def prompt(self) -> list[int]:
        return self.rendered.ids


def fit_to_context(
    render: Callable[[list[Message]], Rendered],
    messages: Sequence[Message],
    max_tokens: int,
    limit: Optional[int],
    policy: ContextPolicy,
    count: Optional[Callable[[Message], int]] = None,
    whole: Optional[Rendered] = None,
) -> Fitted:
    """`count` estimates a message's tokens, to place the block cuts (none: cut at every turn).
    `whole`: all of `messages` rendered, when the caller has it already (`render` then runs only
    for the shorter conversations a "truncate" tries)."""
    messages = list(messages)
    first = whole if whole is not None else render(messages)
    if limit is None or len(first.ids) + max_tokens <= limit:
        return Fitted(messages, first, 0)
    if policy != "truncate":
        raise ContextLengthError(len(first.ids), max_tokens, limit)
    lead = 0
    while lead < len(messages) - 1 and messages[lead]["role"] == "system":
        lead += 1
    body = messages[lead:-1]
    # Cut points: drop body[:k] where the rest starts with a user turn (templates want the
    # user/assistant alternation), or everything. Fewer tokens the more is dropped.
    ks = [k for k in range(1, len(body)) if body[k]["role"] == "user"] + [len(body)]
    if count is not None:
        ks = _blocks(ks, [count(m) for m in body], max(limit // 4, 1))
    tried: dict[int, Rendered] = {}

    def rendered(k: int) -> Rendered:
        if k not in tried:
            tried[k] = render(messages[:lead] + body[k:] + messages[-1:])
        return tried[k]

    def fits(k: int) -> bool:
        return len(rendered(k).ids) + max_tokens <= limit

    if not fits(ks[-1]):
        raise ContextLengthError(len(rendered(ks[-1]).ids), max_tokens, limit,
                                 " (even with only the system prompt and the last message)")
    k = ks[bisect.bisect_left(ks, True, key=fits)]  # the fewest dropped that fit
    return Fitted(messages[:lead] + body[k:] + messages[-1:], rendered(k), k)


def _blocks(ks: list[int], sizes: list[int], step: int) -> list[int]:
    """The cut points at which the dropped messages first reach another multiple of `step`
    tokens (and dropping everything droppable, always)."""
    out: list[int] = []
    mark = step
    dropped = 0
    done = 0
    for k in ks[:-1]:
        dropped += sum(sizes[done:k])
        done = k
        if dropped >= mark:
            out.append(k)
            mark = (dropped // step + 1) * step
    return out + ks[-1:]
