"""From the event loop to the engine thread and back: the bounded request queue and one job.

Every generation runs as `fn(engine)` on the engine executor's single thread, the same thread
(and so the same Engine and prompt cache) that the GUI uses: a request and the GUI never run
MLX at the same time, they simply queue. Events come back to the asyncio loop with
`call_soon_threadsafe`, in order, followed by one `Done`.

The queue is bounded: at most `limit` requests are admitted (waiting or running); one more is
refused (429) rather than left waiting without end. Counters live on the loop thread only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from engine.serve.schema import APIError, TokenLogprob, TokenText
from engine.types import CancelToken, GenerationResult, PrefillProgress, TokenEvent

DEFAULT_QUEUE_LIMIT = 32  # requests waiting or running at most
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765


class ModelChanged(Exception):
    """The window loaded another model between a request's admission and its turn."""


@dataclass
class Done:
    result: Optional[GenerationResult] = None
    error: Optional[BaseException] = None
    entries: Optional[list[TokenLogprob]] = None  # every token's logprob, when asked


@dataclass
class Tokens:
    """One TokenEvent, plus its logprob entry when the request asked for logprobs."""

    event: TokenEvent
    entry: Optional[TokenLogprob] = None


Item = Union[PrefillProgress, Tokens, Done]


class TokenNamer:
    """Token id -> (text, UTF-8 bytes) for logprobs, memoised (engine thread only)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self._memo: dict[int, TokenText] = {}

    def __call__(self, token: int) -> TokenText:
        out = self._memo.get(token)
        if out is None:
            out = self._memo[token] = _token_text(self._tok, token)
        return out

    def entry(self, token: int, logprob: float, top: Optional[list[tuple[int, float]]]) -> TokenLogprob:
        return TokenLogprob(self(token), logprob, [(self(t), lp) for t, lp in top] if top is not None else None)


def _token_text(tok: Any, token: int) -> TokenText:
    text = tok.decode([token])
    if "\ufffd" not in text:
        return text, list(text.encode("utf-8"))
    raw = _piece_bytes(tok, token)  # part of a character: report its bytes, as OpenAI does
    if raw is None:
        return text, list(text.encode("utf-8"))
    return raw.decode("utf-8", errors="replace"), list(raw)


_BYTE_DECODER: Optional[dict[str, int]] = None


def _piece_bytes(tok: Any, token: int) -> Optional[bytes]:
    """Raw bytes of a byte-level BPE piece ("Ġ..." alphabet) or a SentencePiece byte ("<0xE2>")."""
    global _BYTE_DECODER
    try:
        piece = tok.convert_ids_to_tokens(token)
    except Exception:
        return None
    if not isinstance(piece, str):
        return None
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return bytes([int(piece[3:5], 16)])
        except ValueError:
            return None
    if _BYTE_DECODER is None:
        # GPT-2's reversible byte <-> printable character table.
        bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
        cs = bs[:]
        n = 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        _BYTE_DECODER = {chr(c): b for b, c in zip(bs, cs)}
    if all(ch in _BYTE_DECODER for ch in piece):
        return bytes(_BYTE_DECODER[ch] for ch in piece)
    return None


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
        self.closing = True
        for token in list(self._active):
            token.cancel()


class Job:
    """One admitted request: submitted to the engine thread at once, its events on `items`."""

    def __init__(self, state: ServerState, executor: Any, request: Any, model_key: Optional[str],
                 want_logprobs: bool) -> None:
        self.loop = asyncio.get_running_loop()
        self.state = state
        self.request = request
        self.model_key = model_key
        self.want_logprobs = want_logprobs
        self.cancel = CancelToken()
        self.items: "asyncio.Queue[Item]" = asyncio.Queue()
        self.admitted = next(state._admitted)
        self.started: Optional[int] = None
        self._state_running = False
        self._finished = False
        if state.closing:
            raise APIError(503, "the server is shutting down", "server_error", code="shutting_down")
        if state.waiting + state.running >= state.limit:
            state.refused += 1
            state._changed()
            raise APIError(429, f"the request queue is full ({state.limit} requests waiting or running); "
                                "retry later", "rate_limit_error", code="queue_full")
        state.waiting += 1
        state._active.add(self.cancel)
        state._changed()
        self.future: concurrent.futures.Future = executor.submit(self._run)
        self.future.add_done_callback(self._done)

    def queue_info(self) -> dict[str, Any]:
        return {"admitted": self.admitted, "started": self.started}

    # -- engine thread -------------------------------------------------------------------------
    def _post(self, item: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.items.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def _call(self, fn: Callable[[], None]) -> None:
        try:
            self.loop.call_soon_threadsafe(fn)
        except RuntimeError:
            pass

    def _run(self, engine: Any) -> Done:
        if self.cancel.cancelled:  # the client left while waiting: never touch the engine
            return Done(error=asyncio.CancelledError())
        self.started = next(self.state._started)
        self._call(self._mark_running)
        info = getattr(engine, "info", None)
        if self.model_key is not None and (info is None or info.key != self.model_key):
            raise ModelChanged("the model changed while the request waited; send it again")
        namer = TokenNamer(engine.lm.tokenizer) if self.want_logprobs else None

        def on_event(e: Any) -> None:
            if isinstance(e, TokenEvent):
                entry = namer.entry(e.token, e.logprob, e.top_logprobs) if namer is not None else None
                self._post(Tokens(e, entry))
            elif isinstance(e, PrefillProgress):
                self._post(e)

        result = engine.generate(self.request, on_event, self.cancel)
        entries = None
        if namer is not None:
            tops = result.top_logprobs or [None] * len(result.tokens)
            entries = [namer.entry(t, lp, top) for t, lp, top in zip(result.tokens, result.logprobs, tops)]
        return Done(result=result, entries=entries)

    def _done(self, fut: concurrent.futures.Future) -> None:
        if fut.cancelled():
            done = Done(error=asyncio.CancelledError())
        elif fut.exception() is not None:
            done = Done(error=fut.exception())
        else:
            done = fut.result()
        self._call(lambda: self._finish(done))  # one callback: the counts are right once Done is seen

    def _finish(self, done: Done) -> None:
        self._mark_finished()
        self.items.put_nowait(done)

    # -- loop thread ---------------------------------------------------------------------------
    def _mark_running(self) -> None:
        if self._finished or self._state_running:
            return
        self._state_running = True
        self.state.waiting -= 1
        self.state.running += 1
        self.state._changed()

    def _mark_finished(self) -> None:
        if self._finished:
            return
        self._finished = True
        if self._state_running:
            self.state.running -= 1
        else:
            self.state.waiting -= 1
        self.state.served += 1
        self.state._active.discard(self.cancel)
        self.state._changed()

    def abandon(self) -> None:
        """The client is gone (or the server stops): stop generating, free the slot when done."""
        self.cancel.cancel()
        self.future.cancel()  # succeeds only while still waiting
