"""The generation loop: restore, aligned chunked prefill, last token alone, seeded decode.

`stream()` is a generator, in the style of mlx-lm's `generate_step` / `stream_generate`: it
yields one `RestoreEvent` (what the restore did, the prefill planned), `PrefillProgress` and
`TokenEvent`s and returns the `GenerationResult` (StopIteration's value). `drain()` runs it to the end with an optional callback. Stopping: cancel the
request's `CancelToken` (the result is kept, with finish reason "cancelled"), or close the
generator (nothing is returned; snapshots taken so far are still stored).

It runs in parts, each a function whose return value goes into the `CacheReport`:
`restore()` (the planner's snapshot, cut back, or a new cache) -> `Restored`;
`prefill()` (a generator: the prompt but its last token, in the canonical schedule's chunks)
-> `Prefilled`; `decode()` (a generator: the last prompt token alone, then sampled tokens) ->
`Decoded`; `build_report()` puts them together. `snapshot_points()` says where the snapshots
of one generation are taken, `_Snapshots` takes them.

Our own loop rather than mlx-lm's because the cache needs control between prefill and decode:
snapshots at exact points, the last prompt token forwarded alone even on a cache hit, and
chunks cut at absolute positions so warm and cold runs forward the same widths (the only way a
reused cache gives bit-identical logprobs: docs/architecture.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Generator, Optional, Sequence

import mlx.core as mx

from engine.cache.families import (
    always_trimmable,
    class_names,
    cut_back,
    layer_offset,
    trimmable,
)
from engine.cache.prompt_cache import PromptCache
from engine.cache.namespace import cache_key
from engine.cache.kinds import RestoreSource, SnapshotKind
from engine.cache.meta import SnapshotMeta
from engine.cache.planner import chunks, exact_at, exact_tail_at, schedule_cuts
from engine.cache.snapshot import cache_arrays, cache_nbytes, describe_layers, new_snapshot_id
from engine.generate.constraints import Guide
from engine.generate.model import LoadedModel
from engine.generate.prepare import Prepared
from engine.generate.sampling import Sampler, logits_processors, top_logprobs
from engine.generate.stops import reply_stops
from engine.generate.templating import TextStream
from engine.types import (
    CacheReport,
    CancelToken,
    Event,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    LayerInfo,
    PrefillProgress,
    RestoreEvent,
    TokenEvent,
)


class _Snapshots:
    """Takes the snapshots of one generation and lists them (`stored`, for the report).

    It also keeps the cache's history: every forward that computed a position of it (`forwards`,
    from the restored snapshot's and then this generation's) and where its blocks end (`ends`):
    what names a snapshot's blocks (engine/cache/blocks.py). When the disk tier writes them is
    the prompt cache's business (`PromptCache.generation`).
    """

    def __init__(self, lm: LoadedModel, prompt_cache: Optional[PromptCache], rest: "Restored",
                 classes: tuple[str, ...], key: str) -> None:
        self.lm, self.prompt_cache = lm, prompt_cache
        self.key = key  # the cache's lookup key: the model's, within the request's namespace
        self.exact_cuts, self.classes = rest.exact_cuts, classes  # this generation's exact history
        self.forwards: list[tuple[int, int]] = list(rest.forwards)
        self.ends: list[int] = list(rest.block_ends)
        self.known = rest.history_known  # False: restored from a snapshot that kept no history
        self.stored: list[dict[str, Any]] = []  # kind / length / canonical of each, in order

    def forwarded(self, start: int, end: int, cut: bool = False) -> None:
        """The model forwarded positions [start, end); `cut`: a block ends at `end`."""
        self.forwards.append((start, end))
        if cut:
            self.ends.append(end)

    def take(self, kind: SnapshotKind, tokens: Sequence[int], cache: list[Any],
             documents: tuple[str, ...] = ()) -> Optional[str]:  # fmt: skip
        """Store a snapshot of `cache` holding `tokens` (and, a document's, the digests of the
        documents it holds); its id (None: nothing stored)."""
        if self.prompt_cache is None or not tokens:
            return None
        n = len(tokens)
        meta = SnapshotMeta(
            id=new_snapshot_id(),
            model_key=self.key,
            tokens=tuple(tokens),
            kind=kind,
            exact_cuts=tuple(c for c in self.exact_cuts if c <= len(tokens)),
            classes=self.classes,
            trimmable=trimmable(cache),
            nbytes=cache_nbytes(cache),
            forwards=tuple(f for f in self.forwards if f[0] < n) if self.known else (),
            block_ends=tuple(sorted({e for e in self.ends if e < n})),
            documents=documents,
        )
        self.prompt_cache.store(meta, cache)  # copies what the memory lacks; `cache` goes on
        self.stored.append({"kind": kind, "length": meta.length, "canonical": meta.canonical})
        return meta.id

    def keep_partial(self, prompt: Sequence[int], cache: list[Any], restored: int, done: int) -> None:
        """Stopped mid-prefill with the cache complete up to `done`: keep it if that state is exact."""
        if restored < done and done in self.exact_cuts:
            self.take(SnapshotKind.PARTIAL, prompt[:done], cache)


# -- restore -------------------------------------------------------------------------------------


@dataclass
class Restored:
    """The live cache `restore()` hands to prefill, and what the planner said about it."""

    cache: list[Any]
    restored: int  # prompt tokens the cache holds (never the whole prompt)
    exact_cuts: tuple[int, ...]  # the cuts this generation's states follow, as far as they are exact
    layers: list[LayerInfo]  # each layer as restored, before any prefill
    matched: int = 0  # longest common prefix with any stored snapshot
    stored: Optional[int] = None  # length of the snapshot restored from, None if none
    snapshot_id: Optional[str] = None  # the snapshot restored from
    source: Optional[RestoreSource] = None  # None: nothing restored
    declines: list[str] = field(default_factory=list)  # why longer matches were not usable
    forwards: tuple[tuple[int, int], ...] = ()  # the restored positions' history (SnapshotMeta.forwards)
    block_ends: tuple[int, ...] = ()  # where the restored positions' blocks end (the restore point too)
    history_known: bool = True

    @property
    def partial(self) -> bool:
        """A snapshot cut back to fewer tokens than it held."""
        return self.stored is not None and self.restored < self.stored


def restore(key: str, lm: LoadedModel, prompt: list[int], mode: str, cuts: tuple[int, ...],
            prompt_cache: Optional[PromptCache], singles_from: Optional[int] = None) -> Restored:
    """The longest usable snapshot for `prompt` (the planner's pick, cut back), else a new cache.
    `singles_from`: a Continue, whose prompt ends with the reply so far (decoded one token per
    forward from there): its snapshots' exact cuts stop there, as the unstopped run's did."""
    cache: Optional[list[Any]] = None
    restored = 0
    exact_cuts = cuts
    matched, declines, stored, source, snapshot_id = 0, [], None, None, None
    forwards: tuple[tuple[int, int], ...] = ()
    block_ends: tuple[int, ...] = ()
    known = True
    if prompt_cache is not None:
        plan, cache = prompt_cache.fetch(key, prompt, mode, cuts, singles_from)
        matched, declines = plan.matched, plan.declines
        if cache is not None and plan.meta is not None:
            restored, stored, source, snapshot_id = plan.reuse, plan.meta.length, plan.source, plan.meta.id
            forwards = tuple(f for f in plan.meta.forwards if f[0] < restored)
            block_ends = tuple(e for e in plan.meta.block_ends if e < restored) + (restored,)
            known = bool(plan.meta.forwards)
            if not (exact_at(plan.meta, restored, cuts) or exact_tail_at(plan.meta, restored, cuts, singles_from)):
                # fast mode: exact only as far as the source was
                exact_cuts = tuple(c for c in plan.meta.exact_cuts if c <= restored)
    if cache is None:
        cache = lm.new_cache()
    if singles_from is not None:  # decoded positions are no cuts of the reply's exact history
        exact_cuts = tuple(c for c in exact_cuts if c <= singles_from)
    assert restored <= len(prompt) - 1, "never restore the whole prompt"
    return Restored(cache, restored, exact_cuts, describe_layers(cache), matched, stored, snapshot_id, source,
                    declines, forwards, block_ends, known)


# -- prefill -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SnapshotPoints:
    """Where one generation takes snapshots before its end snapshot (planner.py lists the kinds)."""

    boundary: Optional[int]  # the cut at which prefill takes a "boundary" snapshot (None: none)
    prelast_now: bool  # take "pre-last" as soon as prefill is done
    prelast_by_end: bool  # "pre-last" is served by the end snapshot; taken only if no token is decoded
    # The cuts at attached documents' ends that this prefill passes: a "document" snapshot at each,
    # what any conversation about those files restores (kept ahead of turns: cache/eviction.py).
    documents: tuple[int, ...] = ()
    held: dict[int, tuple[str, ...]] = field(default_factory=dict)  # end -> digests of the documents there


def snapshot_points(n_prompt: int, cuts: tuple[int, ...], restored: int, caching: bool,
                    always_cut: bool) -> SnapshotPoints:
    """Caches that cannot be cut back (`always_cut` False) keep a checkpoint at the last cut before
    n - 1: where the next turn's exact restore lands (the start of the generation prompt, or a
    multiple of C), and a pre-last snapshot (cache = prompt[:-1]). Plain KV caches can be cut
    back, so the end snapshot taken after decode serves every restore a pre-last one could:
    copying it after prefill would only delay the first token."""
    boundary = cuts[-2] if len(cuts) > 1 else 0
    prelast_due = caching and restored < n_prompt - 1
    return SnapshotPoints(
        boundary=boundary if caching and not always_cut and restored < boundary else None,
        prelast_now=prelast_due and not always_cut,
        prelast_by_end=prelast_due and always_cut,
    )


@dataclass
class Prefilled:
    """What `prefill()` forwarded."""

    chunks: list[list[int]]  # [start, end) of each forward; then [n - 1, n] when decode will forward it
    cancelled: bool
    prefill_tokens: int = 0  # tokens forwarded before decode, the last one included (stopped: those forwarded)
    t_end: Optional[float] = None  # when the prefill ended (stopped or done)


def prefill(lm: LoadedModel, prompt: list[int], cache: list[Any], restored: int, cuts: tuple[int, ...],
            points: SnapshotPoints, snaps: _Snapshots, is_cancelled: Callable[[], bool],
            last_block_cut: Optional[int] = None) -> Generator[PrefillProgress, None, Prefilled]:
    """Forward prompt[restored:-1] in the canonical schedule's chunks, yielding progress before the
    first and after each; take the snapshots `points` asks for. Stopped mid-way (cancelled, or
    closed), it keeps the cache as a "partial" snapshot if that state is exact. A Continue's
    decoded tail is forwarded one token at a time, as decoding did: no block ends there
    (`last_block_cut`: the last position a block may end at; None: every chunk's end)."""
    n_prompt = len(prompt)
    done = restored  # prompt tokens in the cache
    forwarded: list[list[int]] = []

    def stopped() -> Prefilled:  # what a stopped prefill did: the forwards it made, none after
        return Prefilled(forwarded, True, done - restored, time.perf_counter())

    try:
        yield PrefillProgress(restored, n_prompt)
        for start, end in chunks(restored, cuts):
            if is_cancelled():
                snaps.keep_partial(prompt, cache, restored, start)
                return stopped()
            lm.model(mx.array([prompt[start:end]]), cache=cache)
            mx.eval(cache_arrays(cache))
            snaps.forwarded(start, end, cut=last_block_cut is None or end <= last_block_cut)
            done = end
            forwarded.append([start, end])
            yield PrefillProgress(end, n_prompt)
            if end in points.documents:
                snaps.take(SnapshotKind.DOCUMENT, prompt[:end], cache, points.held.get(end, ()))
            elif end == points.boundary:
                snaps.take(SnapshotKind.BOUNDARY, prompt[:end], cache)
    except GeneratorExit:  # closed by the consumer: keep what a regenerate needs, then end
        mx.eval(cache_arrays(cache))
        if done < n_prompt - 1:
            snaps.keep_partial(prompt, cache, restored, done)
        raise
    if points.prelast_now:
        snaps.take(SnapshotKind.PRE_LAST, prompt[:-1], cache)
    if is_cancelled():  # the last prompt token is never forwarded: nothing will be decoded
        if points.prelast_by_end:  # no end snapshot to serve a regenerate
            snaps.take(SnapshotKind.PRE_LAST, prompt[:-1], cache)
        return stopped()
    forwarded.append([n_prompt - 1, n_prompt])
    return Prefilled(forwarded, False, n_prompt - restored, time.perf_counter())


# -- the whole generation ------------------------------------------------------------------------


def stream(
    lm: LoadedModel,
    p: Prepared,
    prompt_cache: Optional[PromptCache],
    chunk: int,
    cancel: Optional[CancelToken] = None,
    guide: Optional[Guide] = None,
) -> Generator[Event, None, GenerationResult]:
    """Generate the reply to the prepared request `p` (engine/generate/prepare.py): its prompt's
    schedule cuts at multiples of `chunk`, at `p.message_starts` and at `p.reply_header_cuts`
    (canonical cuts, see cache/planner.py); its context limit ends decoding (finish reason
    "context") before the model's context is full. `prompt_cache` None, or the request's
    `use_cache` False: nothing looked up or stored (a cold run). `guide`: the request's grammar,
    masking every decode step.

    `p.document_points`: the cuts where attached documents end (engine/documents); a snapshot is
    kept at each one this prefill computes, naming the documents it holds (what eviction asks,
    engine/cache/eviction.py).

    `p.earlier`: a Continue of a reply that has these tokens so far. The unstopped run forwarded
    them one at a time after the last prompt token, so the continuation forwards the same: its
    "prompt" is the prompt and the reply so far, its schedule the prompt's cuts and then one cut
    per decoded position. The cache restores the state before the reply's last token (the
    planner accepts a decoded tail whose forwards were those: planner.exact_tail_at), or, if no
    snapshot holds it, recomputes it with those forwards; then the last token goes alone and
    decoding goes on at step len(earlier): the next logits equal the unstopped run's, bit for bit."""
    request, earlier, message_starts = p.request, p.earlier, p.message_starts
    t0 = time.perf_counter()
    is_cancelled = (lambda: cancel.cancelled) if cancel is not None else (lambda: False)
    prompt = list(p.prompt)
    n_asked = len(prompt)  # the conversation's prompt; a Continue forwards its reply so far after it
    cuts = schedule_cuts(n_asked, chunk, message_starts, p.reply_header_cuts)
    singles_from: Optional[int] = None
    if earlier:
        singles_from = n_asked - 1
        prompt = list(prompt) + list(earlier)
        cuts = cuts + tuple(range(n_asked, len(prompt)))  # decode's forwards: one token each
    if not request.use_cache:
        prompt_cache = None
    # The request's cache namespace is part of the lookup key (engine/cache/namespace.py).
    key = cache_key(lm.key, request.cache_namespace)
    rest = restore(key, lm, prompt, request.mode, cuts, prompt_cache, singles_from)
    cache = rest.cache
    points = snapshot_points(len(prompt), cuts, rest.restored, prompt_cache is not None, always_trimmable(cache))
    if earlier:  # the prompt's boundary snapshot is the reply's business, taken when it began
        points = replace(points, boundary=None)
    elif prompt_cache is not None:
        points = replace(points, documents=tuple(e for e in sorted(p.document_points)
                                                 if rest.restored < e < len(prompt) - 1 and e in cuts),
                         held=dict(p.document_points))
    snaps = _Snapshots(lm, prompt_cache, rest, class_names(cache), key)
    starts = [m for m in message_starts if m in cuts]
    t_prefill = time.perf_counter()

    def report_of(pre: Prefilled, decoded: Optional[Decoded]) -> CacheReport:
        report = build_report(request, lm.key, chunk, n_asked, starts, rest, pre, snaps.stored,
                              Timing(t0, t_prefill, decoded))
        p.describe(report)
        return report

    # What the restore did and what prefill will forward, before it does (a debug view shows it).
    planned = [[a, b] for a, b in chunks(rest.restored, cuts)] + [[len(prompt) - 1, len(prompt)]]
    yield RestoreEvent(report_of(Prefilled([], False), None), planned)
    t_prefill = time.perf_counter()

    def result(pre: Prefilled, decoded: Optional[Decoded]) -> GenerationResult:
        report = report_of(pre, decoded)
        asked = prompt[:n_asked]
        if earlier:
            report.continued_from = len(earlier)
            report.continued_chars = decoded.kept_chars if decoded is not None else 0
            report.continue_note = continue_note(len(earlier), n_asked, rest, pre)
        if decoded is None:
            return GenerationResult("", [], [], "cancelled", request.sampler.seed, asked, report)
        return GenerationResult(decoded.text, decoded.tokens, decoded.logprobs, decoded.finish, request.sampler.seed,
                                asked, report, decoded.tops)

    pre: Optional[Prefilled] = None
    try:
        pre = yield from prefill(lm, prompt, cache, rest.restored, cuts, points, snaps, is_cancelled,
                                 singles_from)
        if pre.cancelled:
            return result(pre, None)
        decoded = yield from decode(lm, request, prompt, cache, is_cancelled, p.context.limit, guide, len(earlier))
        mx.eval(cache_arrays(cache))
        n = len(prompt)
        snaps.forwarded(n - 1, n)  # the last prompt token, alone; then one forward per decoded token
        for i in range(decoded.forwarded):
            snaps.forwarded(n + i, n + i + 1)
        if prompt_cache is not None and decoded.tokens:
            fed = prompt + decoded.tokens[: decoded.forwarded]
            assert all(layer_offset(c) in (None, len(fed)) for c in cache), "cache/token bookkeeping drifted"
            sid = snaps.take(SnapshotKind.END, fed, cache)
            if sid is not None and prompt_cache is not None:  # a regenerate restores from it
                prompt_cache.keep_spare(sid, cache)  # this cache, handed over: nothing holds it now
        return result(pre, decoded)
    except GeneratorExit:  # closed mid-decode (prefill keeps its own state): what a regenerate needs
        if pre is not None:
            mx.eval(cache_arrays(cache))
            if points.prelast_by_end:  # plain KV: cut the cache back to prompt[:-1]
                cut_back(cache, (layer_offset(cache[0]) or 0) - (len(prompt) - 1))
                snaps.take(SnapshotKind.PRE_LAST, prompt[:-1], cache)
        raise


# -- the report ----------------------------------------------------------------------------------


@dataclass
class Timing:
    """When a generation started, when its prefill started, and its decode's token times."""

    t0: float
    t_prefill: float
    decoded: Optional[Decoded]

    def rates(self, pre: Prefilled) -> tuple[float, float, float]:
        """(time to first token, prefill tokens/s, decode tokens/s); zeros where nothing was decoded
        (a stopped prefill: its own rate, to where it stopped)."""
        d = self.decoded
        prefill_tokens = pre.prefill_tokens
        if d is None or d.t_first is None:
            took = pre.t_end - self.t_prefill if pre.t_end is not None else 0.0
            return 0.0, prefill_tokens / took if prefill_tokens and took > 0 else 0.0, 0.0
        prefill_s = d.t_first - self.t_prefill
        prefill_tps = prefill_tokens / prefill_s if prefill_s > 0 else 0.0
        # Decode rate from the first to the last token read: storing the end snapshot is not decoding.
        decode_tps = 0.0
        if len(d.tokens) > 1 and d.t_last is not None and d.t_last > d.t_first:
            decode_tps = (len(d.tokens) - 1) / (d.t_last - d.t_first)
        return d.t_first - self.t0, prefill_tps, decode_tps


def build_report(request: GenerationRequest, model_key: str, chunk: int, n_prompt: int, message_starts: list[int],
                 rest: Restored, pre: Prefilled, stored: list[dict[str, Any]], timing: Timing) -> CacheReport:
    """The report of one generation, from what its parts returned."""
    ttft_s, prefill_tps, decode_tps = timing.rates(pre)
    return CacheReport(
        prompt_tokens=n_prompt,
        matched=rest.matched,
        restored=rest.restored,
        stored=rest.stored,
        snapshot_id=rest.snapshot_id,
        partial=rest.partial,
        source=rest.source,
        layer_offsets=[layer.offset for layer in rest.layers],
        layers=rest.layers,
        declines=rest.declines,
        prefill_tokens=pre.prefill_tokens,
        chunks=pre.chunks,
        message_starts=message_starts,
        snapshots_stored=list(stored),
        mode=request.mode,
        chunk_size=chunk,
        sampler=request.sampler.to_dict(),
        seed=request.sampler.seed,
        ttft_s=ttft_s,
        prefill_tps=prefill_tps,
        decode_tps=decode_tps,
        model_key=model_key,
    )


def continue_note(n_earlier: int, n_asked: int, rest: Restored, pre: Prefilled) -> str:
    """How a Continue got to the state before its reply's last token (the report's line)."""
    target = n_asked + n_earlier - 1
    head = f"continued from token {n_earlier}: "
    if rest.restored == target:
        return head + f"restored {rest.restored} (prompt {n_asked} + {n_earlier - 1} reply tokens), prefilled 1"
    why = "; ".join(rest.declines) or "no snapshot holds the reply so far"
    return head + (f"restored {rest.restored}, recomputed {target - rest.restored} with the unstopped "
                   f"run's forwards ({why}), prefilled {pre.prefill_tokens}")


# -- decode --------------------------------------------------------------------------------------


@dataclass
class Decoded:
    tokens: list[int]
    logprobs: list[float]
    forwarded: int  # decoded tokens fed back to the model: the cache ends with tokens[:forwarded]
    finish: FinishReason
    text: str
    t_first: Optional[float]
    t_last: Optional[float]
    tops: list[list[tuple[int, float]]]  # per token, when the request asked for top_logprobs
    kept_chars: int = 0  # a Continue: characters of the reply so far that `text` follows


def decode(
    lm: LoadedModel, request: GenerationRequest, prompt: list[int], cache: list[Any], is_cancelled: Callable[[], bool],
    context_limit: Optional[int] = None, guide: Optional[Guide] = None, earlier: int = 0,
) -> Generator[Event, None, Decoded]:
    """Forward the last prompt token, then sample and feed back tokens; yield one event per token.
    Never runs past `context_limit` positions: then it ends with finish reason "context".
    `guide`: the request's grammar (engine/generate/constraints.py), masking every step.
    `earlier`: a Continue, the prompt's last `earlier` tokens are the reply so far: the key
    schedule, the grammar, the stop strings, the text and max_tokens go on from them (the
    repetition penalty's history is the prompt's end, which holds them); what it returns and
    yields is the new part only (event indices from 0)."""
    settings = request.sampler
    # The grammar's mask reflects every token read so far (the guide consumed them).
    sampler = Sampler(settings, start=earlier,
                      processors=logits_processors(settings, guide.mask if guide is not None else None))
    use_history = settings.repetition_penalty != 1.0
    history = mx.array(prompt[-settings.repetition_context :]) if use_history else None
    text = TextStream(lm.tokenizer, set(lm.no_text))
    stops = reply_stops(request, lm.tokenizer, guide is not None)  # free text only (stops.py)
    ends = lm.reply_ends
    tokens: list[int] = []
    logprobs: list[float] = []
    n_top = request.top_logprobs
    tops: list[list[tuple[int, float]]] = []
    forwarded = 0
    sent = ""  # text already handed out in events (never the possible start of a stop string)
    final_text: Optional[str] = None
    t_first: Optional[float] = None
    t_last: Optional[float] = None
    if earlier:  # the reply so far, read as the unstopped run read it
        for token in prompt[len(prompt) - earlier :]:
            tokens.append(token)
            text.add(token)
            if guide is not None:
                guide.consume(token)
        stops.find(text.text)  # no stop string in it (Engine.prepare refuses one): searched once
        sent = stops.shown(text.text)
    kept = len(sent)  # characters of the reply so far the new text follows

    def forward(token_in: mx.array) -> mx.array:
        return lm.model(token_in.reshape(1, 1), cache=cache)[:, -1, :]

    def pick(logits: mx.array) -> tuple[mx.array, mx.array, Any]:
        token, logprob, dist = sampler.sample(logits, history)
        return token, logprob, (top_logprobs(dist, n_top) if n_top > 0 else None)

    def step(token_in: mx.array) -> tuple[mx.array, mx.array, Any]:
        return pick(forward(token_in))

    def read_top(top: Any) -> Optional[list[tuple[int, float]]]:
        if top is None:
            return None
        # Tokens a grammar forbids (logprob -inf) are no alternatives: left out (and JSON has no -inf).
        return [(int(i), float(v)) for i, v in zip(top[0].tolist(), top[1].tolist()) if v != -float("inf")]

    def schedule(token_in: mx.array) -> Callable[[], tuple[mx.array, mx.array, Any]]:
        """Queue the forward of the newest decoded token (read or not yet); the returned call
        gives the next (token, logprob, top). Under a grammar only the forward is queued: the
        mask needs the token read and consumed first, so sampling waits for that call."""
        nonlocal history, forwarded
        forwarded += 1
        if use_history:
            history = mx.concatenate([history, token_in])
        if guide is not None:
            logits = forward(token_in)
            mx.async_eval(logits)
            return lambda: pick(logits)
        out = step(token_in)
        mx.async_eval(out[0], out[1], *(out[2] or ()))
        return lambda: out

    y, lp, top = step(mx.array([prompt[-1]]))
    max_tokens = settings.max_tokens
    room = context_limit - (len(prompt) - earlier) + 1 if context_limit is not None else max_tokens
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
            pending = schedule(y)
        token, logprob, top_read = int(y.item()), float(lp.item()), read_top(top)
        if guide is not None and token not in ends:
            guide.consume(token)
        t_last = time.perf_counter()
        if t_first is None:
            t_first = t_last
        tokens.append(token)
        logprobs.append(logprob)
        if top_read is not None:
            tops.append(top_read)
        text.add(token)
        if token in ends:  # an end token, or a control token that ends a turn
            ended = "stop"
        elif (stop_at := stops.find(text.text)) is not None:
            final_text = text.text[:stop_at]
            ended = "stop"
        else:
            # An event for every token, also one that completes no text yet (part of a
            # character, a held-back piece): listeners that batch text flush on events.
            shown = stops.shown(text.text)
            yield TokenEvent(len(tokens) - 1 - earlier, token, logprob, shown[len(sent) :], top_read)
            sent = shown
            ended = "cancelled" if is_cancelled() else None
        if queue_next:
            y, lp, top = pending()
        elif ended is None and len(tokens) < max_tokens:
            y, lp, top = schedule(y)()
    if final_text is None:
        text.flush()  # the last characters, decoded as they are, may complete a stop string
        final_text = text.text if (stop_at := stops.find(text.text, final=True)) is None else text.text[:stop_at]
        ended = ended or ("stop" if stop_at is not None else None)
    if len(tokens) > earlier and len(final_text) > len(sent) and final_text.startswith(sent):
        yield TokenEvent(len(tokens) - 1 - earlier, tokens[-1], logprobs[-1], final_text[len(sent) :],
                         tops[-1] if tops else None)
    return Decoded(tokens[earlier:], logprobs, forwarded, ended or ("context" if limited else "length"),
                   final_text[kept:], t_first, t_last, tops, kept)


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


