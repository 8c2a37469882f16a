"""The generation loop: restore, aligned chunked prefill, last token alone, seeded decode.

Our own loop rather than mlx-lm's `generate_step` because the cache needs control between
prefill and decode: snapshots at exact points, the last prompt token forwarded alone even on
a cache hit, and chunks cut at absolute positions so warm and cold runs forward the same
widths (the only way a reused cache gives bit-identical logprobs, see DESIGN.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import mlx.core as mx
from mlx_lm.models.cache import (
    KVCache,
    QuantizedKVCache,
    can_trim_prompt_cache,
    make_prompt_cache,
)

from engine.cache.memory import PromptCache
from engine.cache.planner import SnapshotMeta, exact_at
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
from engine.generate.templating import TextStream, render_prompt
from engine.types import (
    CacheReport,
    CancelToken,
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


def chunk_bounds(start: int, end: int, chunk: int) -> list[tuple[int, int]]:
    """[start, end) cut at absolute multiples of `chunk`."""
    out = []
    pos = start
    while pos < end:
        stop = min((pos // chunk + 1) * chunk, end)
        out.append((pos, stop))
        pos = stop
    return out


def generate(
    lm: LoadedModel,
    request: GenerationRequest,
    prompt_cache: Optional[PromptCache],
    chunk: int,
    on_event: Optional[Callable[[Any], None]] = None,
    cancel: Optional[CancelToken] = None,
    prompt: Optional[list[int]] = None,
) -> GenerationResult:
    t0 = time.perf_counter()
    emit = on_event or (lambda e: None)
    is_cancelled = (lambda: cancel.cancelled) if cancel is not None else (lambda: False)
    prompt = prompt if prompt is not None else render_prompt(lm.tokenizer, request.messages)
    n_prompt = len(prompt)
    settings = request.sampler
    report = CacheReport(
        prompt_tokens=n_prompt,
        mode=request.mode,
        chunk_size=chunk,
        sampler=settings.to_dict(),
        seed=settings.seed,
        model_key=lm.key,
    )
    use_cache = request.use_cache and prompt_cache is not None

    # -- restore -----------------------------------------------------------------------------
    cache: Optional[list[Any]] = None
    restored = 0
    src_canonical = 0
    exact_restore = True  # the restored state equals a cold run's at `restored`
    if use_cache:
        plan, cache = prompt_cache.fetch(lm.key, prompt, request.mode, chunk)
        report.matched = plan.matched
        report.declines = plan.declines
        if cache is not None and plan.meta is not None:
            restored = plan.reuse
            report.stored = plan.meta.length
            report.partial = restored < plan.meta.length
            report.source = plan.source
            src_canonical = plan.meta.canonical
            exact_restore = exact_at(plan.meta, restored, n_prompt, chunk)
    if cache is None:
        cache = lm.new_cache()
    report.restored = restored
    report.layers = describe_layers(cache)
    report.layer_offsets = [layer_offset(c) for c in cache]
    assert restored <= n_prompt - 1, "never restore the whole prompt"

    # Exactness of what this generation's prefill will compute (see prompt_cache docstring).
    if exact_restore:
        canonical = (n_prompt - 1) // chunk * chunk
    else:
        canonical = min(restored, src_canonical) // chunk * chunk
    boundary = (n_prompt - 1) // chunk * chunk
    all_plain_kv = plain_kv(cache)
    want_boundary = use_cache and not all_plain_kv and restored < boundary < n_prompt - 1
    classes = tuple(type(c).__name__ for c in cache)

    # Snapshots taken before decode go to the disk tier only once decoding is over: its writer
    # thread (serialise, SHA-256, fsync) otherwise competes with the decode loop for the CPU;
    # on 2 cores that cost the demo model ~13% decode tok/s (docs/benchmarks.md, items 2 and 4).
    deferred: list[Snapshot] = []

    def persist_deferred() -> None:
        disk = prompt_cache.disk if prompt_cache is not None else None
        if disk is not None:
            for snap in deferred:
                disk.save_async(snap)
        deferred.clear()

    def snapshot(kind: str, tokens: Sequence[int], cache_now: list[Any], defer: bool = False) -> None:
        if not use_cache or not tokens:
            return
        snap_cache = clone_cache(cache_now)
        meta = SnapshotMeta(
            id=new_snapshot_id(),
            model_key=lm.key,
            tokens=tuple(tokens),
            kind=kind,
            canonical=min(canonical, len(tokens)) // chunk * chunk,
            prefill_end=n_prompt - 1,
            prefill_exact=exact_restore and len(tokens) >= n_prompt - 1,
            classes=classes,
            trimmable=can_trim_prompt_cache(snap_cache),
            nbytes=cache_nbytes(snap_cache),
        )
        snap = Snapshot(meta, snap_cache)
        prompt_cache.put(snap, persist=not defer)
        if defer:
            deferred.append(snap)
        report.snapshots_stored.append({"kind": kind, "length": meta.length, "canonical": meta.canonical})

    # -- prefill prompt[restored:-1] in aligned chunks ------------------------------------
    t_prefill = time.perf_counter()
    emit(PrefillProgress(restored, n_prompt))
    for start, end in chunk_bounds(restored, n_prompt - 1, chunk):
        if is_cancelled():
            # What is in the cache is complete up to `start`: keep it only if it is exact.
            if start % chunk == 0 and start <= canonical and start > restored:
                snapshot("partial", prompt[:start], cache)
            return _finish(report, prompt, [], [], "cancelled", settings.seed, t0, t_prefill, None, None)
        lm.model(mx.array([prompt[start:end]]), cache=cache)
        mx.eval(cache_arrays(cache))
        report.chunks.append([start, end])
        emit(PrefillProgress(end, n_prompt))
        if want_boundary and end == boundary:
            snapshot("boundary", prompt[:boundary], cache)
    # The pre-last snapshot (cache = prompt[:-1]). Plain KV caches can be cut back, so the end
    # snapshot taken after decode serves every restore this one could: copying it here would
    # only delay the first token. It is taken for them only if no token gets decoded.
    prelast_due = use_cache and restored < n_prompt - 1
    prelast_by_end = prelast_due and all_plain_kv
    if prelast_due and not all_plain_kv:
        snapshot("pre-last", prompt[:-1], cache, defer=True)

    # -- the last prompt token, alone; then decode ---------------------------------------
    report.chunks.append([n_prompt - 1, n_prompt])
    report.prefill_tokens = n_prompt - restored
    sampler = Sampler(settings)
    use_history = settings.repetition_penalty != 1.0
    history = mx.array(prompt[-settings.repetition_context :]) if use_history else None
    stream = TextStream(lm.tokenizer, lm.eos_ids)
    tokens: list[int] = []
    logprobs: list[float] = []
    n_top = request.top_logprobs
    tops: list[list[tuple[int, float]]] = []  # per token, when n_top > 0
    forwarded = 0  # decoded tokens fed back to the model: the cache ends with tokens[:forwarded]
    sent = ""  # text already handed to on_event
    final_text: Optional[str] = None
    t_first: Optional[float] = None
    t_last: Optional[float] = None

    def step(token_in: mx.array) -> tuple[mx.array, mx.array, Any]:
        logits = lm.model(token_in.reshape(1, 1), cache=cache)[:, -1, :]
        token, logprob, dist = sampler.sample(logits, history)
        return token, logprob, (top_logprobs(dist, n_top) if n_top > 0 else None)

    if is_cancelled():
        if prelast_by_end:
            snapshot("pre-last", prompt[:-1], cache)
        persist_deferred()
        return _finish(report, prompt, [], [], "cancelled", settings.seed, t0, t_prefill, None, None)

    def schedule(token_in: mx.array) -> tuple[mx.array, mx.array, Any]:
        """Queue the forward of the newest decoded token (read or not yet)."""
        nonlocal history, forwarded
        forwarded += 1
        if use_history:
            history = mx.concatenate([history, token_in])
        out = step(token_in)
        mx.async_eval(out[0], out[1], *(out[2] or ()))
        return out

    def read_top(top: Any) -> Optional[list[tuple[int, float]]]:
        if top is None:
            return None
        return list(zip((int(i) for i in top[0].tolist()), (float(v) for v in top[1].tolist())))

    def accept(token: int, logprob: float, top: Optional[list[tuple[int, float]]]) -> Optional[str]:
        """Take one sampled token; the finish reason if generation ends with it."""
        nonlocal sent, final_text
        tokens.append(token)
        logprobs.append(logprob)
        if top is not None:
            tops.append(top)
        stream.add(token)
        if token in lm.eos_ids:
            return "stop"
        stop_at = _find_stop(stream.text, request.stop)
        if stop_at is not None:
            final_text = stream.text[:stop_at]
            return "stop"
        # An event for every token, also when it completes no text yet (part of a character, a
        # held-back piece): listeners that batch text flush on events, and must get them.
        emit(TokenEvent(len(tokens) - 1, token, logprob, stream.text[len(sent) :], top))
        sent = stream.text
        return "cancelled" if is_cancelled() else None

    y, lp, top = step(mx.array([prompt[-1]]))
    max_tokens = settings.max_tokens
    ended: Optional[str] = None
    while ended is None and len(tokens) < max_tokens:
        # Pipelined: queue the forward that consumes this token before reading it, so host work
        # (text, events) overlaps the device's. Not for the first token: on the CPU backend
        # queueing a forward's ops blocks this thread while earlier ones run, which put most of
        # a second decode step into the time to first token (docs/benchmarks.md, item 1).
        queue_next = t_first is not None and len(tokens) + 1 < max_tokens
        if queue_next:
            next_y, next_lp, next_top = schedule(y)
        token, logprob, top_read = int(y.item()), float(lp.item()), read_top(top)
        t_last = time.perf_counter()
        if t_first is None:
            t_first = t_last
        ended = accept(token, logprob, top_read)
        if queue_next:
            y, lp, top = next_y, next_lp, next_top
        elif ended is None and len(tokens) < max_tokens:
            y, lp, top = schedule(y)
    finish = ended or "length"
    if final_text is None:
        stream.flush()
        final_text = stream.text
    if tokens and len(final_text) > len(sent) and final_text.startswith(sent):
        emit(TokenEvent(len(tokens) - 1, tokens[-1], logprobs[-1], final_text[len(sent) :],
                        tops[-1] if tops else None))
    mx.eval(cache_arrays(cache))
    if use_cache and tokens:
        fed = prompt + tokens[:forwarded]
        assert all(layer_offset(c) in (None, len(fed)) for c in cache), "cache/token bookkeeping drifted"
        snapshot("end", fed, cache)
    persist_deferred()
    result = _finish(report, prompt, tokens, logprobs, finish, settings.seed, t0, t_prefill, t_first, final_text,
                     t_last)
    result.top_logprobs = tops
    return result


def _find_stop(text: str, stops: Sequence[str]) -> Optional[int]:
    hits = [text.find(s) for s in stops if s]
    hits = [h for h in hits if h >= 0]
    return min(hits) if hits else None


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
