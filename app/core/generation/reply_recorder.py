"""Saving one reply as it streams, on the engine thread (an `engine.bridge` observer): the
generation passes one to `engine_batches` (app/core/generation/model.py) and reads what it saved
(`saved`) once the Done has reached the loop."""

from __future__ import annotations

import time
from typing import Any, Optional

from app.core.generation.continuing import earlier_of, whole_result
from app.core.store.session import ChatSession, PendingReply, SavedReply
from engine.bridge import Done, Failed
from engine.types import TokenEvent

PARTIAL_SAVE_S = 5.0  # how often a long reply's streamed text and tokens are written to the store


class ReplyRecorder:
    """Saves one reply on the engine thread (an `engine.bridge` observer): the text with its
    tokens every PARTIAL_SAVE_S, then the reply and its run; what streamed if the engine raised.
    On the engine thread so a reply is saved even when the window closes mid-reply."""

    def __init__(self, session: ChatSession, pending: PendingReply, every: float = PARTIAL_SAVE_S) -> None:
        self.session, self.pending, self.every = session, pending, every
        # A Continue saves the whole reply: the reply so far, then what streams (continuing.py).
        self.tokens, self.logprobs = earlier_of(pending)
        self.offset = len(self.tokens)  # event indices count the new tokens only
        self.pieces: list[str] = [pending.earlier_text] if self.offset else []
        self.saved_at = time.perf_counter()
        self.saved: Optional[SavedReply] = None  # set on the engine thread before the Done is posted

    def __call__(self, event: Any) -> None:
        if isinstance(event, TokenEvent):
            self.pieces.append(event.text)
            if self.offset + event.index >= len(self.logprobs):  # a new token (not text released late)
                self.logprobs.append(event.logprob)
                self.tokens.append(event.token)
            now = time.perf_counter()
            if now - self.saved_at >= self.every:
                self.saved_at = now
                # An id the stream did not name (-1: a server that does not send ids): keep none.
                known = all(t >= 0 for t in self.tokens)
                self.session.save_partial(self.pending, "".join(self.pieces), self.tokens if known else [],
                                          self.logprobs if known else [])
        elif isinstance(event, Done):
            self.saved = self.session.finish(self.pending, whole_result(self.pending, event.result))
        elif isinstance(event, Failed):
            self.session.fail(self.pending, "".join(self.pieces))
