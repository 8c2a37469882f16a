"""The generation loop: restore, aligned chunked prefill, last token alone, seeded decode.

`stream()` is a generator, in the style of mlx-lm's `generate_step` / `stream_generate`: it
yields `PrefillProgress` and `TokenEvent`s and returns the `GenerationResult` (StopIteration's
value). `drain()` runs it to the end with an optional callback. Stopping: cancel the
request's `CancelToken` (the result is kept, with finish reason "cancelled"), or close the
generator (nothing is returned; snapshots taken so far are still stored).

Our own loop rather than mlx-lm's because the cache needs control between prefill and decode:
snapshots at exact points, the last prompt token forwarded alone even on a cache hit, and
chunks cut at absolute positions so warm and cold runs forward the same widths (the only way a
reused cache gives bit-identical logprobs: docs/architecture.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Optional, Sequence

import mlx.core as mx
from mlx_lm.models.cache import (
    KVCache,
    QuantizedKVCache,
    can_trim_prompt_cache,
    make_prompt_cache,
    trim_prompt_cache,
)

from engine.cache.memory import PromptCache
from engine.cache.planner import SnapshotMeta, chunks, exact_at, schedule_cuts
from engine.cache.snapshot import (
    Snapshot,
    cache_arrays,
    cache_nbytes,
    clone_cache,
    describe_layers,
    layer_offset,
    new_snapshot_id,
    plain_kv,
)
from engine.generate.sampling import Sampler, top_logprobs
from engine.generate.stops import StopStrings
from engine.generate.templating import TextStream, render_prompt
from engine.types import (
    CacheReport,
    CancelToken,
    Event,
    GenerationRequest,
    GenerationResult,
    PrefillProgress,
    TokenEvent,
)


@dataclass
class LoadedModel:
    """A model ready to generate: created on the worker thread that will use it."""

    model: Any
    tokenizer: Any
    path: str
    name: str
    key: str  # model identity + every cache-affecting option; snapshots never cross keys
    kv_bits: Optional[int] = None
    kv_group_size: int = 64
    eos_ids: set[int] = field(default_factory=set)

    def new_cache(self) -> list[Any]:
        cache = make_prompt_cache(self.model)
        if self.kv_bits:
            cache = [
                QuantizedKVCache(group_size=self.kv_group_size, bits=self.kv_bits) if type(c) is KVCache else c
                for c in cache
            ]
        return cache


class _Snapshots:
    """Takes the snapshots of one generation and records them in its report.

    Snapshots taken before decode reach the disk tier only once decoding is over (`defer`):
    the disk writer (serialise, SHA-256, fsync) would otherwise compete with decode for the CPU.
    """

    def __init__(self, lm: LoadedModel, prompt_cache: Optional[PromptCache], report: CacheReport,
                 exact_cuts: tuple[int, ...], classes: tuple[str, ...]) -> None:
        self.lm, self.prompt_cache, self.report = lm, prompt_cache, report
        self.exact_cuts, self.classes = exact_cuts, classes  # this generation's exact history
        self.deferred: list[Snapshot] = []

    def take(self, kind: str, tokens: Sequence[int], cache: list[Any], defer: bool = False) -> None:
        if self.prompt_cache is None or not tokens:
            return
        snap_cache = clone_cache(cache)
        meta = SnapshotMeta(
            id=new_snapshot_id(),
            model_key=self.lm.key,
            tokens=tuple(tokens),
            kind=kind,
            exact_cuts=tuple(c for c in self.exact_cuts if c <= len(tokens)),
            classes=self.classes,
            trimmable=can_trim_prompt_cache(snap_cache),
            nbytes=cache_nbytes(snap_cache),
        )
        snap = Snapshot(meta, snap_cache)
        self.prompt_cache.put(snap, persist=not defer)
        if defer:
            self.deferred.append(snap)
        self.report.snapshots_stored.append({"kind": kind, "length": meta.length, "canonical": meta.canonical})

    def persist_deferred(self) -> None:
        disk = self.prompt_cache.disk if self.prompt_cache is not None else None
        if disk is not None:
            for snap in self.deferred:
                disk.save_async(snap)
        self.deferred.clear()


def stream(
    lm: LoadedModel,
    request: GenerationRequest,
    prompt_cache: Optional[PromptCache],
    chunk: int,
    cancel: Optional[CancelToken] = None,
    prompt: Optional[list[int]] = None,
    message_starts: Sequence[int] = (),
    context_limit: Optional[int] = None,
) -> Generator[Event, None, GenerationResult]:
    """Generate a reply to `prompt` (rendered from the request if not given). `message_starts`
    are the token positions where rendered messages start (canonical cuts, see cache/planner.py);
    `context_limit` ends decoding (finish reason "context") before the model's context is full."""
    t0 = time.perf_counter()
    is_cancelled = (lambda: cancel.cancelled) if cancel is not None else (lambda: False)
    prompt = prompt if prompt is not None else render_prompt(lm.tokenizer, request.messages)
    n_prompt = len(prompt)
    cuts = schedule_cuts(n_prompt, chunk, message_starts)
    settings = request.sampler
    report = CacheReport(
        prompt_tokens=n_prompt,
        mode=request.mode,
        chunk_size=chunk,
        sampler=settings.to_dict(),
        seed=settings.seed,
        model_key=lm.key,
        message_starts=[m for m in message_starts if m in cuts],
    )
    if not request.use_cache:
        prompt_cache = None

    # -- restore: the planner picks the longest usable snapshot, never the whole prompt --------
    cache: Optional[list[Any]] = None
    restored = 0
    exact_cuts = cuts  # the history this generation's states follow, as far as it is exact
    if prompt_cache is not None:
        plan, cache = prompt_cache.fetch(lm.key, prompt, request.mode, cuts)
        report.matched = plan.matched
        report.declines = plan.declines
        if cache is not None and plan.meta is not None:
            restored = plan.reuse
            report.stored = plan.meta.length
            report.partial = restored < plan.meta.length
            report.source = plan.source
            if not exact_at(plan.meta, restored, cuts):  # fast mode: exact only as far as the source was
                exact_cuts = tuple(c for c in plan.meta.exact_cuts if c <= restored)
    if cache is None:
        cache = lm.new_cache()
    report.restored = restored
    report.layers = describe_layers(cache)
    report.layer_offsets = [layer_offset(c) for c in cache]
    assert restored <= n_prompt - 1, "never restore the whole prompt"

    # Caches that cannot be cut back keep a checkpoint at the last cut before n - 1: where the
    # next turn's exact restore lands (the start of the generation prompt, or a multiple of C).
    boundary = cuts[-2] if len(cuts) > 1 else 0
    all_plain_kv = plain_kv(cache)
    want_boundary = prompt_cache is not None and not all_plain_kv and restored < boundary
    snaps = _Snapshots(lm, prompt_cache, report, exact_cuts, tuple(type(c).__name__ for c in cache))
    t_prefill = time.perf_counter()

    def cancelled_result() -> GenerationResult:
        return _finish(report, prompt, [], [], "cancelled", settings.seed, t0, t_prefill, None, None)

    def keep_partial(done: int) -> None:
        """Stopped mid-prefill with the cache complete up to `done`: keep it if that state is exact."""
        if restored < done and done in exact_cuts:
            snaps.take("partial", prompt[:done], cache)

    done = restored  # prompt tokens in the cache
    prelast_by_end = False
    try:
        # -- prefill prompt[restored:-1] in the canonical schedule's chunks ----------------------
        yield PrefillProgress(restored, n_prompt)
        for start, end in chunks(restored, cuts):
            if is_cancelled():
                keep_partial(start)
                return cancelled_result()
            lm.model(mx.array([prompt[start:end]]), cache=cache)
            mx.eval(cache_arrays(cache))
            done = end
            report.chunks.append([start, end])
            yield PrefillProgress(end, n_prompt)
            if want_boundary and end == boundary:
                snaps.take("boundary", prompt[:boundary], cache)
        # The pre-last snapshot (cache = prompt[:-1]). Plain KV caches can be cut back, so the
        # end snapshot taken after decode serves every restore this one could: copying it here
        # would only delay the first token. For them it is taken only if no token is decoded.
        prelast_due = prompt_cache is not None and restored < n_prompt - 1
        prelast_by_end = prelast_due and all_plain_kv
        if prelast_due and not all_plain_kv:
            snaps.take("pre-last", prompt[:-1], cache, defer=True)
        report.chunks.append([n_prompt - 1, n_prompt])
        report.prefill_tokens = n_prompt - restored
        if is_cancelled():
            if prelast_by_end:
                snaps.take("pre-last", prompt[:-1], cache)
            return cancelled_result()

        # -- the last prompt token, alone; then decode ------------------------------------------
        decoded = yield from _decode(lm, request, prompt, cache, is_cancelled, context_limit)
        mx.eval(cache_arrays(cache))
        if prompt_cache is not None and decoded.tokens:
            fed = prompt + decoded.tokens[: decoded.forwarded]
            assert all(layer_offset(c) in (None, len(fed)) for c in cache), "cache/token bookkeeping drifted"
            snaps.take("end", fed, cache)
        result = _finish(report, prompt, decoded.tokens, decoded.logprobs, decoded.finish, settings.seed, t0,
                         t_prefill, decoded.t_first, decoded.text, decoded.t_last)
        result.top_logprobs = decoded.tops
        return result
    except GeneratorExit:  # closed by the consumer: keep what a regenerate needs, then end
        mx.eval(cache_arrays(cache))
        if done < n_prompt - 1:
            keep_partial(done)
        elif prelast_by_end:  # plain KV, mid-decode: cut the cache back to prompt[:-1]
            trim_prompt_cache(cache, (layer_offset(cache[0]) or 0) - (n_prompt - 1))
            snaps.take("pre-last", prompt[:-1], cache)
        raise
    finally:
        snaps.persist_deferred()


@dataclass
class _Decoded:
    tokens: list[int]
    logprobs: list[float]
    forwarded: int  # decoded tokens fed back to the model: the cache ends with tokens[:forwarded]
    finish: str
    text: str
    t_first: Optional[float]
    t_last: Optional[float]
    tops: list[list[tuple[int, float]]]  # per token, when the request asked for top_logprobs


def _decode(
    lm: LoadedModel, request: GenerationRequest, prompt: list[int], cache: list[Any], is_cancelled: Callable[[], bool],
    context_limit: Optional[int] = None,
) -> Generator[Event, None, _Decoded]:
    """Forward the last prompt token, then sample and feed back tokens; yield one event per token.
    Never runs past `context_limit` positions: then it ends with finish reason "context"."""
    settings = request.sampler
    sampler = Sampler(settings)
    use_history = settings.repetition_penalty != 1.0
    history = mx.array(prompt[-settings.repetition_context :]) if use_history else None
    text = TextStream(lm.tokenizer, lm.eos_ids)
    stops = StopStrings(request.stop)
    tokens: list[int] = []
    logprobs: list[float] = []
    n_top = request.top_logprobs
    tops: list[list[tuple[int, float]]] = []
    forwarded = 0
    sent = ""  # text already handed out in events (never the possible start of a stop string)
    final_text: Optional[str] = None
    t_first: Optional[float] = None
    t_last: Optional[float] = None

    def step(token_in: mx.array) -> tuple[mx.array, mx.array, Any]:
        logits = lm.model(token_in.reshape(1, 1), cache=cache)[:, -1, :]
        token, logprob, dist = sampler.sample(logits, history)
        return token, logprob, (top_logprobs(dist, n_top) if n_top > 0 else None)

    def read_top(top: Any) -> Optional[list[tuple[int, float]]]:
        if top is None:
            return None
        return list(zip((int(i) for i in top[0].tolist()), (float(v) for v in top[1].tolist())))

    def schedule(token_in: mx.array) -> tuple[mx.array, mx.array, Any]:
        """Queue the forward of the newest decoded token (read or not yet)."""
        nonlocal history, forwarded
        forwarded += 1
        if use_history:
            history = mx.concatenate([history, token_in])
        out = step(token_in)
        mx.async_eval(out[0], out[1], *(out[2] or ()))
        return out

    y, lp, top = step(mx.array([prompt[-1]]))
    max_tokens = settings.max_tokens
    room = context_limit - len(prompt) + 1 if context_limit is not None else max_tokens
    limited = room < max_tokens  # the context, not max_tokens, ends this reply
    max_tokens = max(min(max_tokens, room), 0)
    ended: Optional[str] = None
    while ended is None and len(tokens) < max_tokens:
        # Pipelined: queue the forward that consumes this token before reading it, so host work
        # (text, events) overlaps the device's. Not for the first token: on the CPU backend
        # queueing a forward's ops blocks this thread while earlier ones run, which would put
        # most of a second decode step into the time to first token.
        queue_next = t_first is not None and len(tokens) + 1 < max_tokens
        if queue_next:
            next_y, next_lp, next_top = schedule(y)
        token, logprob, top_read = int(y.item()), float(lp.item()), read_top(top)
        t_last = time.perf_counter()
        if t_first is None:
            t_first = t_last
        tokens.append(token)
        logprobs.append(logprob)
        if top_read is not None:
            tops.append(top_read)
        text.add(token)
        if token in lm.eos_ids:
            ended = "stop"
        elif (stop_at := stops.find(text.text)) is not None:
            final_text = text.text[:stop_at]
            ended = "stop"
        else:
            # An event for every token, also one that completes no text yet (part of a
            # character, a held-back piece): listeners that batch text flush on events.
            shown = stops.shown(text.text)
            yield TokenEvent(len(tokens) - 1, token, logprob, shown[len(sent) :], top_read)
            sent = shown
            ended = "cancelled" if is_cancelled() else None
        if queue_next:
            y, lp, top = next_y, next_lp, next_top
        elif ended is None and len(tokens) < max_tokens:
            y, lp, top = schedule(y)
    if final_text is None:
        text.flush()  # the last characters, decoded as they are, may complete a stop string
        final_text = text.text if (stop_at := stops.find(text.text)) is None else text.text[:stop_at]
        ended = ended or ("stop" if stop_at is not None else None)
    if tokens and len(final_text) > len(sent) and final_text.startswith(sent):
        yield TokenEvent(len(tokens) - 1, tokens[-1], logprobs[-1], final_text[len(sent) :],
                         tops[-1] if tops else None)
    return _Decoded(tokens, logprobs, forwarded, ended or ("context" if limited else "length"), final_text,
                    t_first, t_last, tops)


def drain(events: Generator[Event, None, GenerationResult], on_event: Optional[Callable[[Event], None]] = None
          ) -> GenerationResult:
    """The value a generation stream returns, after handing each event to `on_event`."""
    while True:
        try:
            event = next(events)
        except StopIteration as done:
            return done.value
        if on_event is not None:
            on_event(event)


def _finish(
    report: CacheReport,
    prompt: list[int],
    tokens: list[int],
    logprobs: list[float],
    finish: str,
    seed: int,
    t0: float,
    t_prefill: float,
    t_first: Optional[float],
    text: Optional[str],
    t_last: Optional[float] = None,
) -> GenerationResult:
    if t_first is not None:
        report.ttft_s = t_first - t0
        prefill_s = t_first - t_prefill
        report.prefill_tps = report.prefill_tokens / prefill_s if prefill_s > 0 else 0.0
        # Decode rate from the first to the last token read: storing the end snapshot is not decoding.
        if len(tokens) > 1 and t_last is not None and t_last > t_first:
            report.decode_tps = (len(tokens) - 1) / (t_last - t_first)
    if text is None:
        text = ""
    return GenerationResult(text, tokens, logprobs, finish, seed, prompt, report)  # type: ignore[arg-type]
