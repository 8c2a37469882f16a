"""The server's bounded request queue: who is admitted, who waits, who runs, who was served.

Every generation runs through the engine bridge (engine/bridge.py, `engine_batches`) on the
engine executor's single thread, the same thread (and so the same Engine and prompt cache) that
the GUI uses: a request and the GUI never run MLX at the same time, they simply queue.

The queue is bounded: at most `limit` requests are admitted (waiting or running); one more is
refused (429) rather than left waiting without end, and none is admitted while the server stops
(503). A `Ticket` is one admitted request; its `start` and `observe` are the bridge's hooks on
the engine thread: `start` refuses a request cancelled while it waited (the engine is never
touched), notes its turn and checks that the model is still the one it was admitted for;
`observe` names each token for logprobs (the tokenizer lives on the engine thread) and frees
the request's place when the final event is delivered, even after its client left. The
counters change on the loop thread only.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Callable, Optional, Sequence, Union

from engine.bridge import Done, Failed, StreamEvent
from engine.serve import DEFAULT_QUEUE_LIMIT
from engine.serve.report import TokenLogprob
from engine.serve.schema import APIError
from engine.serve.tokens import TokenNamer
from engine.types import CancelToken, TokenEvent


class ModelChanged(Exception):
    """The window loaded another model between a request's admission and its turn."""


class Withdrawn(Exception):
    """A request cancelled before its turn (its client left, or the server is stopping)."""


class ServerState:
    """What the server is serving and how busy it is: read by /verbatim/status and the GUI."""

    def __init__(self, limit: int = DEFAULT_QUEUE_LIMIT) -> None:
        if limit < 1:
            raise ValueError("the queue limit must be at least 1")
        self.limit = limit
        self.waiting = 0
        self.running = 0
        self.served = 0
        self.refused = 0
        self.closing = False
        self._admitted = itertools.count(1)
        self._started = itertools.count(1)  # advanced on the engine thread only
        self._listeners: list[Callable[["ServerState"], None]] = []
        self._active: set[CancelToken] = set()

    def status(self) -> dict[str, Any]:
        return {"waiting": self.waiting, "running": self.running, "limit": self.limit,
                "served": self.served, "refused": self.refused}

    def subscribe(self, fn: Callable[["ServerState"], None]) -> Callable[[], None]:
        self._listeners.append(fn)
        return lambda: self._listeners.remove(fn) if fn in self._listeners else None

    def _changed(self) -> None:
        for fn in list(self._listeners):
            fn(self)

    def cancel_all(self) -> None:
        """The server stops: admit no more, cancel what waits or runs (each ends with its result)."""
        self.closing = True
        for token in list(self._active):
            token.cancel()


class Ticket:
    """One admitted request, from admission (loop thread) to its final event (engine thread).

    `cancel` is the generation's token (the bridge cancels it when its consumer stops reading);
    `entry(i)` is token i's logprob entry once its TokenEvent arrived (`per_token`, streaming);
    `entries` every token's, once the Done arrived. Both only when `want_logprobs`."""

    def __init__(self, state: ServerState, model_key: Optional[str], want_logprobs: bool,
                 per_token: bool = False, stops: Sequence[str] = ()) -> None:
        self.loop = asyncio.get_running_loop()
        self.state = state
        self.model_key = model_key
        self.want_logprobs = want_logprobs
        self.per_token = per_token
        if state.closing:
            raise APIError(503, "the server is shutting down", "server_error", code="shutting_down")
        if state.waiting + state.running >= state.limit:
            state.refused += 1
            state._changed()
            raise APIError(429, f"the request queue is full ({state.limit} requests waiting or running); "
                                "retry later", "rate_limit_error", code="queue_full")
        self.cancel = CancelToken()
        self.admitted = next(state._admitted)
        self.started: Optional[int] = None  # set on the engine thread when its turn comes
        self.entries: Optional[list[TokenLogprob]] = None
        self._by_index: dict[int, TokenLogprob] = {}  # written on the engine thread, popped on the loop
        self._namer: Optional[TokenNamer] = None
        self._stops = tuple(stops)
        self._tokenizer: Any = None  # to name the stop string that ended the reply (when it has any)
        self.stop_string: Optional[str] = None  # set with the Done: the stop string that ended the reply
        self._running = False
        self._finished = False
        state.waiting += 1
        state._active.add(self.cancel)
        state._changed()

    def queue_info(self) -> dict[str, Any]:
        return {"admitted": self.admitted, "started": self.started}

    def entry(self, index: int) -> Optional[TokenLogprob]:
        return self._by_index.pop(index, None)

    # -- the bridge's hooks: engine thread (a Failed may come from the thread that failed the job)
    def start(self, engine: Any) -> None:  # an EngineAPI with `lm` (Engine, the distributed LeaderEngine)
        if self.cancel.cancelled:  # the client left, or the server stops, while it waited
            raise Withdrawn("the request was cancelled before its turn")
        self.started = next(self.state._started)
        self._call(self._mark_running)
        info = engine.info
        if self.model_key is not None and (info is None or info.key != self.model_key):
            raise ModelChanged("the model changed while the request waited; send it again")
        if self.want_logprobs:
            self._namer = TokenNamer(engine.lm.tokenizer)
        if self._stops:
            self._tokenizer = engine.lm.tokenizer

    def observe(self, event: Union[StreamEvent, Failed]) -> None:
        namer = self._namer
        if isinstance(event, TokenEvent):
            if namer is not None and self.per_token:
                self._by_index[event.index] = namer.entry(event.token, event.logprob, event.top_logprobs)
        elif isinstance(event, Done):
            if namer is not None:
                self.entries = namer.entries(event.result)
            if self._tokenizer is not None and event.result.finish_reason == "stop":
                self.stop_string = _stop_string(self._tokenizer, event.result, self._stops)
            self._call(self._mark_finished)  # posted before the Done: the counts are right once it is seen
        elif isinstance(event, Failed):
            self._call(self._mark_finished)

    def finished(self) -> None:
        """A request that is not a generation (tokenize) is done: free its place (any thread)."""
        self._call(self._mark_finished)

    def _call(self, fn: Callable[[], None]) -> None:
        try:
            self.loop.call_soon_threadsafe(fn)
        except RuntimeError:  # the loop is closed: nobody is counting any more
            pass

    # -- loop thread ---------------------------------------------------------------------------
    def _mark_running(self) -> None:
        if self._finished or self._running:
            return
        self._running = True
        self.state.waiting -= 1
        self.state.running += 1
        self.state._changed()

    def _mark_finished(self) -> None:
        if self._finished:
            return
        self._finished = True
        if self._running:
            self.state.running -= 1
        else:
            self.state.waiting -= 1
        self.state.served += 1
        self.state._active.discard(self.cancel)
        self.state._changed()


def _stop_string(tokenizer: Any, result: Any, stops: Sequence[str]) -> Optional[str]:
    """The stop string that ended a reply: the one its decoded tokens go on with past its text
    (the engine cuts the text where the first stop string starts); None when it ended by itself."""
    full = tokenizer.decode(list(result.tokens))
    if not full.startswith(result.text):
        return None
    rest = full[len(result.text):]
    return next((s for s in stops if s and rest.startswith(s)), None)
