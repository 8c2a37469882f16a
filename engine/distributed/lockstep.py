"""Rank 0 leads, the other ranks follow: the same engine loop, in lockstep.

Rank 0's engine thread (`Leader`) runs the jobs the HTTP server submits, as `EngineExecutor`
does. Each tick is one all-reduce of [stop votes, message size]; a message (pickled, rank 0 to
all: the ranks of one launch trust each other) follows as bytes. With links (links.py) rank 0
wakes the followers before each tick and they sleep in between; without, rank 0 ticks every
`tick_s` while idle. The followers (`follow`) wait for ticks and run what arrives:

    ("generate", request)   the same `Engine.stream` on every rank, then one report gather
    ("clear_cache",)        every rank clears its tiers
    ("shutdown",)           every rank leaves the loop and exits 0

Inside a generation, every check of the cancel flag is an all-reduce (`SyncedCancel`): the
loop checks it at the same points on every rank, so a stop on rank 0 (client gone, stop
button, SIGTERM) or a SIGTERM on any rank ends the generation on every rank at the same step.
A peer that dies makes MLX raise at the next collective (`GroupError`), or closes its link
(links.py) when MLX would wait for ever: the leader answers the request in flight with that
error and the server stops; every rank exits non-zero.
"""

from __future__ import annotations

import concurrent.futures
import logging
import pickle
import queue
import threading
from dataclasses import replace
from typing import Any, Callable, Generator, Optional

from engine.distributed.group import Group, GroupError
from engine.distributed.links import PeerLinks
from engine.distributed.report import attach, gather_reports, rank_report
from engine.errors import EngineError
from engine.generate.loop import drain
from engine.types import CancelToken, Comparison, Event, EventCallback, GenerationRequest, GenerationResult

log = logging.getLogger(__name__)

DEFAULT_TICK_S = 0.5  # idle ranks hear from rank 0 this often (and notice a dead peer as soon)


class SyncedCancel(CancelToken):
    """A cancel flag whose every read is one all-reduce: true on all ranks at the same step."""

    def __init__(self, group: Group, local: Optional[CancelToken], stop_vote: Callable[[], bool]) -> None:
        super().__init__()
        self.group, self.local, self.stop_vote = group, local, stop_vote

    @property
    def cancelled(self) -> bool:
        if not self._event.is_set():
            mine = bool(self.local is not None and self.local.cancelled) or self.stop_vote()
            if self.group.sum_ints([int(mine)], "cancel flag")[0] > 0:
                self._event.set()
        return self._event.is_set()


def follow_generation(group: Group, engine: Any, request: GenerationRequest, stop_vote: Callable[[], bool]) -> None:
    """A follower's part of one generation: the same `Engine.stream`, then the report gather.
    Errors raised before any collective (a bad request, found by every rank alike) still reach
    the gather, so the ranks stay in step (rank 0 answers the client with it); a GroupError
    means the group is gone: re-raised."""
    result: Optional[GenerationResult] = None
    error: Optional[BaseException] = None
    try:
        result = drain(engine.stream(request, SyncedCancel(group, None, stop_vote)))
    except GroupError:
        raise
    except Exception as e:  # noqa: BLE001 - see above
        error = e
    gather_reports(group, rank_report(group, result, error))


def _gathered(group: Group, result: Optional[GenerationResult], error: Optional[BaseException]) -> GenerationResult:
    """Rank 0 after a generation: gather every rank's report into the result (or raise its error)."""
    ranks = gather_reports(group, rank_report(group, result, error))
    if error is not None:
        raise error
    assert result is not None
    attach(result, ranks)
    return result


class _Tick:
    """The all-reduce every rank makes each tick: [stop votes, message size] + the message."""

    def __init__(self, group: Group) -> None:
        self.group = group

    def __call__(self, stop_vote: bool, message: Optional[tuple] = None) -> tuple[int, Optional[tuple]]:
        data = pickle.dumps(message) if message is not None else b""
        votes, size = self.group.sum_ints([int(stop_vote), len(data)], "tick")
        if size == 0:
            return votes, None
        return votes, pickle.loads(self.group.broadcast_bytes(data, size, "message"))


class _Either(CancelToken):
    """Cancelled when the caller's token is, or when the consumer closed the stream."""

    def __init__(self, other: Optional[CancelToken]) -> None:
        super().__init__()
        self.other = other

    @property
    def cancelled(self) -> bool:
        return self._event.is_set() or (self.other is not None and self.other.cancelled)


class LeaderEngine:
    """What a job on rank 0 sees as the engine. Whatever runs the model (stream, generate,
    cold_run, verify) and clear_cache run on every rank; info, lm, prompt_ids, token_texts,
    cache_stats are rank 0's own. Loading another model is refused (every rank would need it)."""

    def __init__(self, leader: "Leader", engine: Any) -> None:
        self._leader, self._engine = leader, engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def stream(self, request: GenerationRequest, cancel: Optional[CancelToken] = None
               ) -> Generator[Event, None, GenerationResult]:
        """`Engine.stream` on every rank. Closed early by its consumer, it still runs to the
        end here (cancelled at the next step on every rank), so the ranks stay in step."""
        leader = self._leader
        leader.tick(("generate", request))
        mine = _Either(cancel)
        events = self._engine.stream(request, SyncedCancel(leader.group, mine, leader.stopping))
        result: Optional[GenerationResult] = None
        error: Optional[BaseException] = None
        closed = False
        try:
            while True:
                try:
                    event = next(events)
                except StopIteration as done:
                    result = done.value
                    break
                if not closed:
                    try:
                        yield event
                    except GeneratorExit:
                        closed = True
                        mine.cancel()
        except GroupError:
            raise
        except Exception as e:  # noqa: BLE001 - every rank meets it alike; re-raised after the gather
            error = e
        return _gathered(leader.group, result, error)

    def generate(self, request: GenerationRequest, on_event: Optional[EventCallback] = None,
                 cancel: Optional[CancelToken] = None) -> GenerationResult:
        return drain(self.stream(request, cancel), on_event)

    def cold_run(self, request: GenerationRequest, cancel: Optional[CancelToken] = None) -> GenerationResult:
        return self.generate(replace(request, use_cache=False), None, cancel)

    def verify(self, request: GenerationRequest, result: GenerationResult,
               cancel: Optional[CancelToken] = None) -> Comparison:
        cold = self.cold_run(request, cancel)
        return Comparison.of(result.tokens, result.logprobs, cold.tokens, cold.logprobs)

    def clear_cache(self) -> None:
        self._leader.tick(("clear_cache",))
        self._engine.clear_cache()

    def load(self, *args: Any, **kwargs: Any) -> Any:
        raise EngineError("a distributed server keeps the model it was launched with")


_STOP = object()


class Leader:
    """Rank 0's engine thread: an executor (`submit(fn)` runs `fn(engine)` there, in order)
    that ticks the group between jobs. `startup(engine)` runs first (the coordinated load);
    `on_exit(error)` is called from the thread when the loop ends (None: a clean shutdown)."""

    def __init__(self, group: Group, make_engine: Callable[[], Any], startup: Callable[[Any], Any],
                 on_exit: Callable[[Optional[BaseException]], None], tick_s: float = DEFAULT_TICK_S,
                 links: Optional[PeerLinks] = None) -> None:
        self.group, self.tick_s = group, tick_s
        self._make_engine, self._startup, self._on_exit = make_engine, startup, on_exit
        self._jobs: "queue.Queue[Any]" = queue.Queue()
        self._tick = _Tick(group)
        self._stop_requested = False  # this rank's vote: the server is stopping
        self.peers_stopping = False  # another rank voted to stop (SIGTERM there)
        self.ready: "concurrent.futures.Future[Any]" = concurrent.futures.Future()
        self.error: Optional[BaseException] = None
        self.links = links  # started by `startup` (serve.py); then idle followers sleep
        self._current: Optional["concurrent.futures.Future[Any]"] = None  # the job running now
        self._thread = threading.Thread(target=self._main, name="verbatim-engine-rank0", daemon=True)
        self._thread.start()

    # -- any thread --------------------------------------------------------------------------
    def submit(self, fn: Callable[[Any], Any]) -> "concurrent.futures.Future[Any]":
        fut: "concurrent.futures.Future[Any]" = concurrent.futures.Future()
        if self.error is not None:
            fut.set_exception(self.error)
        else:
            self._jobs.put((fn, fut))
        return fut

    def fail(self, error: BaseException) -> None:
        """The group is gone (a peer's link closed): fail the job running now and every queued
        one, and end the server, even while the engine thread stays blocked in a collective."""
        if self.error is not None:
            return
        self.error = error
        current = self._current
        if current is not None:
            try:
                current.set_exception(error)
            except concurrent.futures.InvalidStateError:
                pass
        self._fail_pending(error)
        self._on_exit(error)

    def peer_stop(self) -> None:
        """A follower was told to stop (its link said so): stop every rank (any thread)."""
        self.peers_stopping = True
        self._jobs.put(None)  # wake the loop

    def stopping(self) -> bool:
        return self._stop_requested

    def shutdown(self, timeout: Optional[float] = None) -> bool:
        """Tell every rank to stop (after the jobs queued so far), and wait for the thread."""
        self._stop_requested = True
        self._jobs.put(_STOP)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- the engine thread ------------------------------------------------------------------
    def tick(self, message: Optional[tuple] = None) -> None:
        if self.links is not None and self.links.active:
            self.links.wake()
        votes, _ = self._tick(self._stop_requested, message)
        if votes > int(self._stop_requested):
            self.peers_stopping = True

    def _main(self) -> None:
        engine = None
        try:
            engine = self._make_engine()
            self.ready.set_result(self._startup(engine))
        except BaseException as e:  # noqa: BLE001 - handed to the waiting CLI
            self._close(engine)  # first: the CLI exits once told, and MLX aborts on live streams
            self.ready.set_exception(e)
            return
        error: Optional[BaseException] = None
        try:
            self._loop(LeaderEngine(self, engine))
        except BaseException as e:  # noqa: BLE001 - the group failed: every waiting job gets it
            error = e
            log.error("rank 0: %s", e)
        if self.error is None:
            self.error = error
        try:
            self._fail_pending(error)
        finally:
            self._close(engine)  # whatever happened: pending disk writes are flushed
            self._on_exit(self.error)

    def _loop(self, engine: LeaderEngine) -> None:
        while True:
            sleeping = self.links is not None and self.links.active
            if not self.peers_stopping:
                self.group.idle = True
                try:
                    item = self._jobs.get(timeout=None if sleeping else self.tick_s)
                except queue.Empty:
                    item = None
                finally:
                    self.group.idle = False
            if self.peers_stopping or item is _STOP:  # any rank told to stop (SIGTERM): all stop
                if self.links is not None:
                    self.links.closing = True  # the followers are about to close their links
                self.tick(("shutdown",))
                return
            if item is None:
                if not sleeping:
                    self.tick()
                continue
            fn, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            self._current = fut
            try:
                value = fn(engine)
            except GroupError as e:
                _settle(fut, error=e)
                raise
            except BaseException as e:  # noqa: BLE001 - the job's own error, for its caller
                _settle(fut, error=e)
            else:
                _settle(fut, value)
            finally:
                self._current = None

    def _fail_pending(self, error: Optional[BaseException]) -> None:
        err = error or GroupError("the distributed server is shutting down")
        while True:
            try:
                item = self._jobs.get_nowait()
            except queue.Empty:
                return
            if item is None or item is _STOP:  # a wake-up (peer_stop), or the stop itself
                continue
            if item[1].set_running_or_notify_cancel():
                item[1].set_exception(err)

    @staticmethod
    def _close(engine: Any) -> None:
        if engine is not None:
            try:
                engine.close()
            except Exception:  # noqa: BLE001
                log.exception("engine close failed")
        # As EngineExecutor does: MLX streams left to the interpreter's exit abort the process.
        import mlx.core as mx

        mx.clear_streams()


def _settle(fut: "concurrent.futures.Future[Any]", value: Any = None, error: Optional[BaseException] = None) -> None:
    """Complete a job's future, unless `Leader.fail` completed it already."""
    try:
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(value)
    except concurrent.futures.InvalidStateError:
        pass


def follow(group: Group, engine: Any, stop_vote: Callable[[], bool], links: Optional[PeerLinks] = None) -> str:
    """A follower's life: run what rank 0 sends until it sends "shutdown" (which it does once
    any rank votes to stop: this one's vote is `stop_vote()`, e.g. after a SIGTERM)."""
    tick = _Tick(group)
    while True:
        if links is not None and links.active:  # sleep until rank 0 announces a tick
            group.idle = True
            links.wait_wake(stop_vote)
            group.idle = False
        _, message = tick(stop_vote())
        if message is None:
            continue
        kind = message[0]
        if kind == "shutdown":
            if links is not None:
                links.close()
            return "rank 0 stopped"
        if kind == "generate":
            follow_generation(group, engine, message[1], stop_vote)
        elif kind == "clear_cache":
            engine.clear_cache()
        else:
            raise GroupError(f"rank {group.rank}: unknown message from rank 0: {kind!r}")
