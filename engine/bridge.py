"""The one way from an asyncio loop to the engine thread and back, and the engine's interface.

`EngineAPI` is what a front end (the window, the inspector, the model manager, the server) may
ask of an engine: `engine.engine.Engine` implements it in process, and a remote engine may
implement it over a connection, on the same `EngineExecutor` (one thread, jobs in order).

`engine_events(executor, request, cancel=...)` runs one generation on the engine thread and
yields its events on the loop, in order: `RestoreEvent`, `PrefillProgress`, `TokenEvent`, then always one final
`Done` carrying the `GenerationResult` (a cancelled generation ends with its partial result,
finish reason "cancelled"); an error the engine raises is raised at the consumer instead.
Events cross threads with `loop.call_soon_threadsafe`, batched: the loop wakes at most once per
`interval` seconds for tokens (the first event and the final one go at once), and nothing is ever
dropped. `engine_batches` yields the same events as lists, one per wake-up, for a consumer that
redraws once per batch (the window).

`observe`, when given, sees every event and then exactly one final `Done` (or `Failed` when the
engine raised), on the engine thread, before they are posted: what must happen even if the loop
never turns again (the app saves a reply there, so a reply is saved when the window closes
mid-reply; the server frees the request's place in its queue there, even after its client left).
A job that failed outside the generation (the engine could not start, the executor failed or
cancelled it before or while it ran) is still observed as a `Failed`, on the thread that ended
the job; nothing after a final is observed or posted.

`engine_call(executor, fn)` runs any other job (`fn(engine)`: load, verify, cache stats) the same
way and awaits its value; `engine_swap(executor, make_engine)` replaces the engine itself (the
window attaching to a server and back) and awaits the new one.

The one exception: the server's admitted jobs (engine/serve/engine_routes.py, `admitted`) submit
to the executor themselves, because they must see whether a job ever ran (one the executor
failed or that was abandoned before its turn frees its queue place), which an awaited value
cannot tell.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Protocol, TypeVar, Union, runtime_checkable

from engine.documents.extract import Document
from engine.engine import ModelInfo
from engine.executor import EngineExecutor
from engine.memory import MemoryReport
from engine.types import (
    CancelToken,
    Comparison,
    ContextInfo,
    Event,
    GenerationRequest,
    GenerationResult,
    PrefillProgress,
    Progress,
    RestoreEvent,
    TokenEvent,
)

T = TypeVar("T")
BATCH_INTERVAL = 0.05  # seconds: at most ~20 wake-ups of the loop per second while tokens stream


@runtime_checkable
class EngineAPI(Protocol):
    """What the app and the server use of an engine (all calls on the engine thread).

    `info` is the loaded model (None before a load succeeds); `context_limit` the tokens one
    request may use (prompt + reply), None when unknown."""

    info: Optional[ModelInfo]

    @property
    def context_limit(self) -> Optional[int]: ...

    def load(self, spec: str, progress: Optional[Progress] = None,
             cancel: Optional[CancelToken] = None) -> ModelInfo:
        """Load a model by spec (a folder, a .gguf file, "demo", a repo id); replaces the current one."""
        ...

    def stream(self, request: GenerationRequest, cancel: Optional[CancelToken] = None
               ) -> Generator[Event, None, GenerationResult]:
        """Generate: yield a RestoreEvent (a remote engine: when the server sends one),
        PrefillProgress and TokenEvents; return the GenerationResult."""
        ...

    def verify(self, request: GenerationRequest, result: GenerationResult,
               cancel: Optional[CancelToken] = None) -> Comparison:
        """Run `request` again with no cache at all and compare with `result`."""
        ...

    def cold_run(self, request: GenerationRequest, cancel: Optional[CancelToken] = None) -> GenerationResult:
        """`request` with no cache at all (neither looked up nor stored)."""
        ...

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The prompt tokens of a conversation (chat template applied)."""
        ...

    def measure(self, request: GenerationRequest) -> ContextInfo:
        """The whole prompt of `request` in tokens and the context limit in force for it, nothing
        run: what the context meter counts before Send."""
        ...

    def document_tokens(self, documents: tuple[Document, ...], system_prompt: str = "") -> list[int]:
        """What each document costs in a conversation with `system_prompt` about them: the count
        a refusal and the report's span give for it (what a document's chip shows)."""
        ...

    def keep_documents(self, digests: Optional[Iterable[str]]) -> None:
        """The documents (files' digests) some conversation still has: their states stay ahead
        of ordinary turns under eviction (None: every document's)."""
        ...

    def preload_documents(self, every_namespace: bool = False) -> int:
        """Read the kept documents' states from the disk into memory (after a restart): the
        window's own, or every namespace's; how many."""
        ...

    def token_texts(self, tokens: list[int]) -> list[str]:
        """The text each token adds (display only)."""
        ...

    def cache_stats(self) -> dict[str, Any]: ...

    def clear_cache(self) -> None: ...

    def memory_report(self) -> Optional[MemoryReport]:
        """Where the engine process's memory is (engine/memory.py); None: not this process's
        (a server's)."""
        ...

    def set_memory_budget(self, budget_bytes: int) -> None:
        """The prompt cache's memory budget from now on: a smaller one evicts at once."""
        ...

    def close(self) -> None: ...


@dataclass
class Done:
    """The final event of a generation: always delivered, after every other event."""

    result: GenerationResult


@dataclass
class Failed:
    """What an observer sees when the engine raised (the consumer gets the error raised)."""

    error: BaseException


StreamEvent = Union[RestoreEvent, PrefillProgress, TokenEvent, Done]
Observer = Callable[[Union[StreamEvent, Failed]], None]


class _Channel:
    """Events from the engine thread to the loop: appended under a lock on the engine thread,
    handed over in batches by a flush scheduled on the loop (at most one pending at a time)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float) -> None:
        self.loop = loop
        self.interval = interval
        self._lock = threading.Lock()
        self._items: list[Union[StreamEvent, Failed]] = []
        self._scheduled = False
        self._last_flush = 0.0  # loop-thread clock of the last hand-over
        self._batches: list[list[Union[StreamEvent, Failed]]] = []  # loop thread only
        self._waiter: Optional[asyncio.Future[None]] = None

    # -- engine thread ------------------------------------------------------------------------
    def put(self, item: Union[StreamEvent, Failed]) -> None:
        final = isinstance(item, (Done, Failed))
        with self._lock:
            self._items.append(item)
            wake = not self._scheduled or final
            self._scheduled = True
        if wake:
            try:
                self.loop.call_soon_threadsafe(self._schedule, final)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                pass

    # -- loop thread --------------------------------------------------------------------------
    def _schedule(self, final: bool) -> None:
        delay = 0.0 if final else self._last_flush + self.interval - time.perf_counter()
        if delay <= 0:
            self._flush()
        else:
            self.loop.call_later(delay, self._flush)

    def _flush(self) -> None:
        with self._lock:
            items, self._items = self._items, []
            self._scheduled = False
        if not items:
            return
        self._last_flush = time.perf_counter()
        self._batches.append(items)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def batches(self) -> AsyncIterator[list[Union[StreamEvent, Failed]]]:
        while True:
            if not self._batches:
                self._waiter = self.loop.create_future()
                await self._waiter
                continue
            yield self._batches.pop(0)


async def engine_batches(
    executor: EngineExecutor,
    request: GenerationRequest,
    cancel: Optional[CancelToken] = None,
    *,
    loop: Optional[asyncio.AbstractEventLoop] = None,
    interval: float = BATCH_INTERVAL,
    observe: Optional[Observer] = None,
    start: Optional[Callable[[EngineAPI], None]] = None,
) -> AsyncGenerator[list[StreamEvent], None]:
    """`engine_events`, as lists of events: one list per wake-up of the loop (never empty; the
    last one ends with the `Done`). `loop`: the loop to deliver on (default: the running one;
    pass it explicitly where Qt drives the loop without asyncio's running loop being set).
    `start(engine)` runs on the engine thread when the job's turn comes, before the generation
    (e.g. the server checks the model is still the one the request was admitted for); what it
    raises ends the stream with that error. A consumer that stops early cancels the generation
    when the generator is closed: close it (`contextlib.aclosing`) rather than leave that to
    garbage collection."""
    loop = loop or asyncio.get_running_loop()
    channel = _Channel(loop, interval)
    token = cancel if cancel is not None else CancelToken()
    ended = threading.Lock()  # one deliverer at a time: the engine thread, or whoever failed the job
    final_sent = False  # under `ended`: the final item went; nothing more goes

    def deliver(item: Union[StreamEvent, Failed]) -> None:
        """Observe, then post; once a final (Done or Failed) went, nothing more goes (any thread)."""
        nonlocal final_sent
        with ended:
            if final_sent:
                return
            last = isinstance(item, (Done, Failed))
            final_sent = last
            try:
                if observe is not None:
                    observe(item)
            except BaseException as e:
                if last:  # the consumer still gets a final: the observer's error, raised there
                    channel.put(Failed(e) if isinstance(item, Done) else item)
                raise
            channel.put(item)

    def run(engine: EngineAPI) -> None:
        try:
            if start is not None:
                start(engine)
            gen = engine.stream(request, cancel=token)
            while True:
                try:
                    event: StreamEvent = next(gen)
                except StopIteration as stop:
                    event = Done(stop.value)
                deliver(event)
                if isinstance(event, Done):
                    return
        except BaseException as e:
            deliver(Failed(e))
            raise  # the job's future fails too (the distributed leader stops on a GroupError)

    def finished(fut: Any) -> None:  # any thread: an error, or a job cancelled before it ran
        if fut.cancelled():
            deliver(Failed(asyncio.CancelledError("the engine job was cancelled before it started")))
        elif fut.exception() is not None:
            deliver(Failed(fut.exception()))

    executor.submit(run).add_done_callback(finished)
    try:
        async for batch in channel.batches():
            events: list[StreamEvent] = []
            for item in batch:
                if isinstance(item, Failed):
                    if events:
                        yield events
                    raise item.error
                events.append(item)
            yield events
            if isinstance(events[-1], Done):
                return
    finally:
        # The consumer stopped early (or was cancelled): stop the generation too.
        token.cancel()


async def engine_events(
    executor: EngineExecutor,
    request: GenerationRequest,
    cancel: Optional[CancelToken] = None,
    *,
    loop: Optional[asyncio.AbstractEventLoop] = None,
    interval: float = BATCH_INTERVAL,
    observe: Optional[Observer] = None,
    start: Optional[Callable[[EngineAPI], None]] = None,
) -> AsyncGenerator[StreamEvent, None]:
    """Generate `request` on the engine thread; yield its events in order, the last a `Done`."""
    async for batch in engine_batches(executor, request, cancel, loop=loop, interval=interval, observe=observe,
                                      start=start):
        for event in batch:
            yield event


async def engine_call(executor: EngineExecutor, fn: Callable[[Any], T],
                      loop: Optional[asyncio.AbstractEventLoop] = None) -> T:
    """Run `fn(engine)` on the engine thread, after every job submitted before it; await its value."""
    return await asyncio.wrap_future(executor.submit(fn), loop=loop or asyncio.get_running_loop())


async def engine_swap(executor: EngineExecutor, make_engine: Callable[[], T],
                      loop: Optional[asyncio.AbstractEventLoop] = None) -> T:
    """Replace the engine (`EngineExecutor.swap`: `make_engine()` on the engine thread, after every
    job before it; the old engine is closed only once the new one exists); await the new one."""
    return await asyncio.wrap_future(executor.swap(make_engine), loop=loop or asyncio.get_running_loop())
