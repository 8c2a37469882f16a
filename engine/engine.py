"""The engine facade that the CLI and the GUI both use.

One `Engine` per worker thread: MLX streams are thread-local, so the model, its caches and
every array must be created on the thread that uses them (docs/architecture.md). The GUI runs an Engine
on its worker thread; the CLI and tests use it directly.
"""

from __future__ import annotations

import json
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Generator, Iterable, Optional

from engine.cache.disk.tier import DiskCache
from engine.cache.eviction import DocumentsKept
from engine.cache.families import class_names
from engine.cache.kinds import SnapshotKind
from engine.cache.namespace import cache_key
from engine.cache.prompt_cache import PromptCache
from engine.constraint import check_tool_results
from engine.documents.placement import DocumentSpan, block, document_spans, place
from engine.errors import EngineError, GGUFError, ModelError, RequestError
from engine.generate.constraints import Grammars, Guide, tool_format
from engine.generate.context import fit_to_context
from engine.generate.loop import LoadedModel, drain, stream
from engine.generate.templating import (
    MessageStarts,
    render_prompt,
    render_prompt_text,
    render_text,
    token_pieces,
)
from engine.models.key import engine_options, model_key
from engine.models.resolve import (
    DEMO_NAME,
    check_folder,
    context_length_of,
    resolve_model,
)
from engine.types import (
    DEFAULT_CHUNK,
    MAX_TOP_LOGPROBS,
    CancelToken,
    Comparison,
    ContextInfo,
    Event,
    EventCallback,
    GenerationRequest,
    GenerationResult,
    validate_messages,
)

DEFAULT_MEMORY_BUDGET = 2 << 30  # bytes of snapshots kept in memory
_PREVIOUS_KEPT = 256  # replies remembered for "identical to previous"


@dataclass
class Prepared:
    """A request as it will run: the messages sent, their tokens, boundaries and context fit."""

    request: GenerationRequest
    prompt: list[int]
    message_starts: list[int]
    context: ContextInfo
    grammar: Optional[str] = None  # the constraint's checked grammar (None: decoding is free)
    # Where each earlier reply's generation header ends but its last token (templating.MessageStarts)
    reply_header_cuts: list[int] = field(default_factory=list)
    # Where each attached document lies in the prompt; its end is a cut (engine/documents/placement.py)
    documents: list[DocumentSpan] = field(default_factory=list)
    # Where a "document" snapshot is taken -> the digests of the documents its state holds: each
    # document's end that is a cut, and the system message's end after the last one
    # (`_document_points`), where every conversation about them still agrees.
    document_points: dict[int, tuple[str, ...]] = field(default_factory=dict)
    earlier: list[int] = field(default_factory=list)  # a Continue: the reply so far (token ids)


@dataclass
class ModelInfo:
    name: str
    path: str
    key: str
    model_type: str
    layers: int
    cache_classes: list[str]
    kv_bits: Optional[int]
    dequantized: bool
    load_s: float
    context_length: Optional[int] = None  # tokens the model was trained for (None: unknown)
    tool_parser: Optional[str] = None  # mlx-lm's tool-call format its template implies (None: no tools)


class Engine:
    def __init__(
        self,
        cache_dir: Optional[Path] = None,
        use_disk: bool = True,
        memory_budget: int = DEFAULT_MEMORY_BUDGET,
        chunk: int = DEFAULT_CHUNK,
        disk_budget: Optional[int] = None,
        dequantize: Optional[bool] = None,
        context_length: Optional[int] = None,
        shard: Optional[Callable[[Any], dict[str, Any]]] = None,
    ) -> None:
        if chunk < 1:
            raise EngineError("chunk size must be at least 1")
        self.chunk = chunk
        self.dequantize = dequantize  # None: decide per backend (see _should_dequantize)
        self.context_length = context_length  # overrides the model's own context length
        # Distributed runs only (engine/distributed/shard.py): splits the loaded model over the
        # ranks in place and returns the sharding's identity, which joins the model key.
        self.shard = shard
        self._starts: Optional[MessageStarts] = None
        self._grammars: Optional[Grammars] = None
        disk = None
        # Which snapshots both tiers drop first: documents' states last while in use (keep_documents).
        self.eviction = DocumentsKept()
        if use_disk:
            disk = DiskCache(cache_dir, budget_bytes=disk_budget, policy=self.eviction)
        self.cache = PromptCache(memory_budget, disk, self.eviction)
        self.lm: Optional[LoadedModel] = None
        self.info: Optional[ModelInfo] = None
        # Last reply per (prompt, settings): lets a report say whether a regenerate was identical.
        self._previous: "OrderedDict[tuple, tuple[list[int], list[float]]]" = OrderedDict()

    # -- models ------------------------------------------------------------------------------
    def load(
        self,
        spec: str,
        progress: Optional[Callable[[float, str], None]] = None,
        cancel: Optional[CancelToken] = None,
    ) -> ModelInfo:
        """Load a model: an MLX folder, a `.gguf` file, `demo`, or a repo id in the HF cache."""
        from mlx_lm import load as mlx_load

        t0 = time.perf_counter()
        folder = _resolve(spec, progress, cancel)
        try:
            options = {k: v for k, v in engine_options(folder).items() if k in ("kv_bits", "kv_group_size")}
        except ModelError as e:
            raise EngineError(str(e)) from e
        try:
            model, tokenizer = mlx_load(str(folder), lazy=self.shard is not None)
        except Exception as e:  # mlx-lm raises many kinds; all mean "this folder is not usable"
            raise EngineError(f"cannot load model from {folder}: {e}") from e
        dequantized = _is_quantized(model) and _should_dequantize(self.dequantize, _expanded_f32_bytes(model))
        if dequantized:
            model = _dequantize_f32(model)
        sharding: dict[str, Any] = {}
        if self.shard is not None:  # distributed: each rank keeps its part of the weights only
            import mlx.core as mx

            sharding = self.shard(model)
            mx.eval(model.parameters())
        # The key covers everything that changes cache contents: weights, KV quantization,
        # chunk size, and whether 4-bit weights were expanded (different arithmetic).
        key = model_key(folder, {**options, "chunk": self.chunk, "dequantized": dequantized, **sharding})
        eos = set(getattr(tokenizer, "eos_token_ids", None) or [])
        if tokenizer.eos_token_id is not None:
            eos.add(int(tokenizer.eos_token_id))
        self.lm = LoadedModel(
            model=model,
            tokenizer=tokenizer,
            path=str(folder),
            name=_display_name(spec, folder),
            key=key,
            kv_bits=options.get("kv_bits"),
            kv_group_size=int(options.get("kv_group_size", 64)),
            eos_ids=eos,
        )
        self._starts = MessageStarts(tokenizer)
        self._grammars = Grammars(tokenizer, _vocab_size(self.lm), eos)
        cache = self.lm.new_cache()
        self.info = ModelInfo(
            name=self.lm.name,
            path=str(folder),
            key=key,
            model_type=getattr(getattr(model, "args", None), "model_type", type(model).__module__.split(".")[-1]),
            layers=len(cache),
            cache_classes=list(class_names(cache)),
            kv_bits=self.lm.kv_bits,
            dequantized=dequantized,
            load_s=time.perf_counter() - t0,
            context_length=context_length_of(check_folder(folder)),
            tool_parser=tool_format(tokenizer),
        )
        return self.info

    # -- generation ----------------------------------------------------------------------------
    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        return render_prompt(self._lm().tokenizer, validate_messages(messages))

    @property
    def context_limit(self) -> Optional[int]:
        """Tokens a request may use (prompt + reply): the user's override, else the model's."""
        if self.context_length is not None:
            return self.context_length
        return self.info.context_length if self.info is not None else None

    def limit_for(self, request: GenerationRequest) -> Optional[int]:
        """The context `request` may use: its own limit (a per-conversation setting), never past
        the model's (or the engine's override); None when neither is known."""
        limit = self.context_limit
        if request.context_length:
            limit = min(limit, request.context_length) if limit else request.context_length
        return limit

    def keep_documents(self, digests: Optional[Iterable[str]]) -> None:
        """The documents some conversation still has (their files' digests): their states stay
        ahead of ordinary turns under eviction, a document no conversation has any more goes as
        an ordinary snapshot does. None: keep every document's state ahead (the default)."""
        self.eviction.in_use = None if digests is None else frozenset(digests)

    def preload_documents(self) -> int:
        """Read the documents' states that are kept warm (keep_documents) from the disk into
        memory while they fit: after a restart the first question about a document restores it
        from memory. The window runs this once a model is loaded, before anything is asked; the
        number of snapshots read."""
        lm = self._lm()
        return len(self.cache.preload(cache_key(lm.key, None),
                                      lambda m: m.kind == SnapshotKind.DOCUMENT and self.eviction.keep_priority(m) > 0))

    def measure(self, request: GenerationRequest) -> ContextInfo:
        """The whole prompt of `request` in tokens (nothing left out, nothing refused) and the
        limit in force for it: what a context meter counts before Send; prepare() then fits it."""
        return ContextInfo(self.limit_for(request), len(_whole_prompt(self._lm(), request)))

    def prepare(self, request: GenerationRequest) -> Prepared:
        """The request as it will run: validated, its prompt rendered (the chat through the
        template, or raw text as is), fitted into the context (or refused with a one-line error
        before any prefill), and its message boundaries."""
        lm = self._lm()
        if not 0 <= request.top_logprobs <= MAX_TOP_LOGPROBS:
            raise RequestError(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}")
        _check_logit_bias(request, _named_tokens(lm))
        grammar = self._check_constraint(request)
        earlier = self._earlier(request)
        limit = self.limit_for(request)
        if request.max_tokens_fit and limit:
            request = _fit_max_tokens(request, lm, limit)
        if request.prompt is not None:  # raw text: nothing to leave out, no message boundaries
            prompt = render_text(lm.tokenizer, request.prompt)
            fit_to_context(lambda m: prompt, [], request.sampler.max_tokens, limit, "refuse")
            return Prepared(request, prompt, [], ContextInfo(limit, len(prompt)), grammar, earlier=earlier)
        messages = validate_messages(request.messages)
        tools = _tools(request)
        if request.documents:
            messages = place(messages, request.documents)
            _check_documents_fit(lm, request, limit, tools)
        fitted = fit_to_context(lambda m: render_prompt(lm.tokenizer, m, tools=tools), messages,
                                request.sampler.max_tokens, limit, request.context_policy,
                                lambda m: len(lm.tokenizer.encode(m["content"])) + 4)
        assert self._starts is not None
        starts = self._starts(fitted.messages, fitted.prompt, tools)
        headers = self._starts.reply_header_cuts(fitted.messages, fitted.prompt, tools)
        spans: list[DocumentSpan] = []
        points: dict[int, tuple[str, ...]] = {}
        if request.documents:
            spans = document_spans(lm.tokenizer, fitted.messages, request.documents, fitted.prompt,
                                   render_prompt_text(lm.tokenizer, fitted.messages, tools))
            starts = sorted(set(starts) | {s.end for s in spans if s.cut})
            points = _document_points(spans, self._starts(fitted.messages[:1], fitted.prompt, tools))
        # The request as it runs: its documents are now in its messages (placed once, never twice).
        return Prepared(replace(request, messages=fitted.messages, documents=()), fitted.prompt, starts,
                        ContextInfo(limit, len(fitted.prompt), fitted.dropped), grammar, headers,
                        documents=spans, document_points=points, earlier=earlier)

    def _earlier(self, request: GenerationRequest) -> list[int]:
        """A Continue's reply so far as token ids, checked: a reply that ended (an end token, a
        stop string) or already has max_tokens has nothing to continue."""
        c = request.continuation
        if c is None:
            return []
        lm = self._lm()
        tokens = list(c.tokens) if c.tokens else (
            list(lm.tokenizer.encode(c.text, add_special_tokens=False)) if c.text else [])
        if not tokens:
            raise RequestError("continue: the reply so far is empty (send the request again instead)", "continue")
        vocab = _vocab_size(lm)
        bad = next((t for t in tokens if not isinstance(t, int) or not 0 <= t < vocab), None)
        if bad is not None:
            raise RequestError(f"continue: {bad!r} is not a token id of this model", "continue")
        if any(t in lm.eos_ids for t in tokens):
            raise RequestError("continue: the reply ended (it holds an end token); nothing to continue", "continue")
        text = lm.tokenizer.decode(tokens)
        hit = next((s for s in request.stop if s and s in text), None)
        if hit is not None:
            raise RequestError(f"continue: the reply ended at the stop string {hit!r}; nothing to continue",
                               "continue")
        if len(tokens) >= request.sampler.max_tokens:
            raise RequestError(f"continue: the reply already has {len(tokens)} tokens and max_tokens "
                               f"({request.sampler.max_tokens}) counts the whole reply: raise it to continue",
                               "max_tokens")
        return tokens

    def _check_constraint(self, request: GenerationRequest) -> Optional[str]:
        """A request's tools and output format, checked against the model before any prefill:
        tools need a template that renders them and a tool-call format mlx-lm can parse; tool
        results must answer calls made; a forced shape must compile. The grammar, if any."""
        c = request.constraint
        if request.prompt is None:
            check_tool_results(request.messages)
        if c is None:
            return None
        lm = self._lm()
        if c.tools and tool_format(lm.tokenizer) is None:
            raise RequestError("'tools': this model's chat template has no tool calling (mlx-lm finds no "
                               "tool-call format in it), so it cannot be offered tools", "tools")
        if c.tools and request.prompt is not None:
            raise RequestError("'tools' need a chat (messages), not a raw prompt", "tools")
        assert self._grammars is not None
        # Compiled grammars are cached per namespace: another API key's schema costs a compile.
        return self._grammars.grammar(c, request.cache_namespace)

    def _guide(self, p: Prepared) -> Optional[Guide]:
        if p.grammar is None:
            return None
        assert self._grammars is not None and p.request.constraint is not None
        return self._grammars.guide(p.grammar, p.request.constraint.failure_param)

    def stream(self, request: GenerationRequest, cancel: Optional[CancelToken] = None
               ) -> Generator[Event, None, GenerationResult]:
        """Generate a reply: yields PrefillProgress and TokenEvents, returns the GenerationResult."""
        lm = self._lm()
        p = self.prepare(request)
        with self.cache.generation():  # the prompt cache decides when its disk tier writes
            result = yield from stream(lm, p.request, self.cache, self.chunk, cancel, p.prompt, p.message_starts,
                                       p.context.limit, self._guide(p), p.reply_header_cuts, p.earlier,
                                       sorted(p.document_points), p.document_points)
        _describe_cuts(result, p)
        if self.cache.disk is not None:
            result.report.warnings = self.cache.pop_warnings()
        if result.finish_reason != "cancelled":
            self._compare_with_previous(lm.key, p.prompt, p.request, result, p.earlier)
        return result

    def generate(
        self,
        request: GenerationRequest,
        on_event: Optional[EventCallback] = None,
        cancel: Optional[CancelToken] = None,
    ) -> GenerationResult:
        """`stream()` run to its end, each event handed to `on_event`."""
        return drain(self.stream(request, cancel), on_event)

    def _compare_with_previous(self, key: str, prompt: list[int], request: GenerationRequest,
                               result: GenerationResult, earlier: Optional[list[int]] = None) -> None:
        """Mark the report identical (or not) to the last reply to the same prompt and settings.
        A Continue compares its whole reply (the reply so far and the new tokens) when it knows
        the reply so far's logprobs, else nothing."""
        tokens, logprobs = result.tokens, result.logprobs
        if earlier:
            c = request.continuation
            if c is None or len(c.logprobs) != len(earlier):
                return
            tokens, logprobs = earlier + tokens, list(c.logprobs) + logprobs
        settings = request.sampler.to_dict()
        if request.sampler.temperature <= 0:
            settings.pop("seed")  # greedy: the seed draws nothing, so replies compare whatever it was
        # The namespace too: whether a reply repeats another's must not tell one API client
        # what another asked (engine/cache/namespace.py).
        # And the constraint: the same prompt under another grammar is another request.
        constraint = request.constraint.digest() if request.constraint is not None else None  # not the schema itself
        k = (key, request.cache_namespace, tuple(prompt), json.dumps(settings, sort_keys=True), request.stop,
             constraint)
        prev = self._previous.get(k)
        if prev is not None:
            cmp = Comparison.of(prev[0], prev[1], tokens, logprobs)
            result.report.identical = cmp.identical
            result.report.first_diff = cmp.first_diff
        self._previous[k] = (tokens, logprobs)
        self._previous.move_to_end(k)
        while len(self._previous) > _PREVIOUS_KEPT:
            self._previous.popitem(last=False)

    def verify(self, request: GenerationRequest, result: GenerationResult, cancel: Optional[CancelToken] = None) -> Comparison:
        """Re-run `request` with no cache at all (the same canonical schedule) and compare with `result`."""
        cold = self.cold_run(request, cancel)
        return Comparison.of(result.tokens, result.logprobs, cold.tokens, cold.logprobs)

    def cold_run(self, request: GenerationRequest, cancel: Optional[CancelToken] = None) -> GenerationResult:
        """`request` with no cache at all: neither looked up nor stored (the canonical schedule)."""
        p = self.prepare(request)
        result = drain(stream(self._lm(), replace(p.request, use_cache=False), None, self.chunk, cancel, p.prompt,
                              p.message_starts, p.context.limit, self._guide(p), p.reply_header_cuts,
                              p.earlier))
        _describe_cuts(result, p)
        return result

    def token_texts(self, tokens: list[int]) -> list[str]:
        """The text each token of a reply adds, for showing it token by token (display only)."""
        return token_pieces(self._lm().tokenizer, tokens)

    # -- cache ---------------------------------------------------------------------------------
    def cache_stats(self) -> dict[str, Any]:
        return self.cache.stats()

    def clear_cache(self) -> None:
        self.cache.clear()
        self._previous.clear()

    def close(self) -> None:
        self.cache.close()

    def _lm(self) -> LoadedModel:
        if self.lm is None:
            raise EngineError("no model loaded")
        return self.lm


# -- helpers: request checks that need the model, model resolution, identity


def _describe_cuts(result: GenerationResult, p: Prepared) -> None:
    """The parts of the report `prepare` knows: the context fit, and the reply header cuts of the
    schedule (each is inside (0, n - 1), so all are cuts: MessageStarts.reply_header_cuts)."""
    result.report.context = p.context
    result.report.reply_header_cuts = list(p.reply_header_cuts)
    restored, source = result.report.restored, result.report.source
    result.report.documents = [
        {"name": s.name, "digest": s.digest, "start": s.start, "end": s.end, "tokens": s.tokens, "cut": s.cut,
         "source": source if source and restored >= s.end else "prefilled"} for s in p.documents]


def _document_points(spans: list[DocumentSpan], system_end: list[int]) -> dict[int, tuple[str, ...]]:
    """Each document end (a cut) -> the digests of the documents the state there holds; and the
    system message's end (`system_end`: the start of the next message, when the system message
    rendered alone is a prefix of the prompt) -> all of them. The documents end the system
    message (placement.place), so what lies between the last one's end and there is the
    template's own closing of the message, the same in every conversation about them: a new
    conversation restores up to where its own first message starts (no forward of those few
    tokens first, which at a long context costs about what the question's own forward does)."""
    points = {s.end: tuple(d.digest for d in spans[: i + 1]) for i, s in enumerate(spans) if s.cut}
    if spans and system_end and system_end[0] > spans[-1].end:
        points[system_end[0]] = tuple(d.digest for d in spans)
    return points


def _check_documents_fit(lm: LoadedModel, request: GenerationRequest, limit: Optional[int], tools: Any) -> None:
    """Documents that cannot fit beside the reply are refused before any prefill, with the
    numbers: never truncated, never left out by the context policy."""
    if not limit:
        return
    base = [m for m in validate_messages(request.messages) if m.get("role") == "system"][:1]
    placed = place(base, request.documents)
    n = len(render_prompt(lm.tokenizer, placed, add_generation_prompt=False, tools=tools))
    room = limit - request.sampler.max_tokens
    if n <= room:
        return
    sizes = ", ".join(f"{d.name} {len(lm.tokenizer.encode(block(d))):,}" for d in request.documents)
    raise RequestError(f"the documents take {n:,} tokens with the system prompt ({sizes}); the context holds "
                       f"{limit:,} with {request.sampler.max_tokens:,} kept for the reply, so at most "
                       f"{max(room, 0):,} fit: attach fewer pages or documents, or use a model with a longer "
                       "context", "documents")

def _vocab_size(lm: LoadedModel) -> int:
    """Width of the model's logits (the output layer may be padded past the tokenizer's size)."""
    n = getattr(getattr(lm.model, "args", None), "vocab_size", None)
    return int(n) if isinstance(n, int) and n > 0 else len(lm.tokenizer.get_vocab())


def _named_tokens(lm: LoadedModel) -> int:
    """Token ids a request may name (logit_bias): the tokenizer's, its base vocabulary and added
    tokens, as /verbatim/tokenize counts them, never past the logits' width. The ids in an output
    layer padded past the tokenizer decode to no text."""
    inner = getattr(lm.tokenizer, "_tokenizer", lm.tokenizer)
    try:
        named = len(inner)
    except TypeError:
        named = len(lm.tokenizer.get_vocab())
    return min(named, _vocab_size(lm))


def _tools(request: GenerationRequest) -> Optional[list[dict[str, Any]]]:
    """The tools the chat template shows for `request` (None: none offered)."""
    return list(request.constraint.tools) if request.constraint is not None and request.constraint.tools else None


def _check_logit_bias(request: GenerationRequest, vocab: int) -> None:
    for token, _ in request.sampler.logit_bias:
        if token >= vocab:
            raise RequestError(f"logit_bias: token id {token} is not in the model's vocabulary "
                               f"(ids 0 to {vocab - 1})")


def _whole_prompt(lm: LoadedModel, request: GenerationRequest) -> list[int]:
    """The request's whole prompt (raw text, or the chat with its documents placed and its
    tools), nothing left out: what measure() counts and a default max_tokens is fitted to."""
    if request.prompt is not None:
        return render_text(lm.tokenizer, request.prompt)
    return render_prompt(lm.tokenizer, place(validate_messages(request.messages), request.documents),
                         tools=_tools(request))


def _fit_max_tokens(request: GenerationRequest, lm: LoadedModel, limit: int) -> GenerationRequest:
    """A default max_tokens shrunk to the room left in the context (a prompt that leaves no room
    at all is still refused by fit_to_context, with its usual message)."""
    room = limit - len(_whole_prompt(lm, request))
    if 1 <= room < request.sampler.max_tokens:
        return replace(request, sampler=replace(request.sampler, max_tokens=room))
    return request


# -- helpers: model resolution and the weights' dtype (dequantize a small quantized model or not)


def _resolve(spec: str, progress: Any, cancel: Any) -> Path:
    try:
        return Path(resolve_model(spec, progress=progress, cancel=cancel))
    except (ModelError, GGUFError) as e:
        raise EngineError(str(e)) from e


DEQUANTIZE_MAX_RAM_FRACTION = 0.25  # expanded f32 weights may take at most this much of the RAM


def _should_dequantize(choice: Optional[bool], f32_bytes: int) -> bool:
    """Expand quantized weights to f32 at load? On the CPU backend, when they fit.

    MLX's CPU quantized matmul uses no BLAS, so f32 weights are faster there with either BLAS
    (docs/benchmarks.md, item 6), at 8x the weight memory for 4-bit: so only while the f32 copy
    stays under a quarter of the machine's RAM. On Metal/CUDA the quantized kernels win.
    """
    if choice is not None:
        return choice
    import mlx.core as mx

    return mx.default_device() == mx.cpu and f32_bytes <= DEQUANTIZE_MAX_RAM_FRACTION * _physical_memory()


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0  # unknown: keep the quantized weights


def _expanded_f32_bytes(model: Any) -> int:
    """Bytes of all weights as f32 once the quantized layers are expanded."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    total = sum(p.size * 4 for _, p in tree_flatten(model.parameters()))
    for _, m in model.named_modules():
        if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            packed = m.weight.size + m.scales.size + (m.biases.size if m.biases is not None else 0)
            total += (m.weight.size * (32 // m.bits) - packed) * 4
    return total


def _is_quantized(model: Any) -> bool:
    import mlx.nn as nn

    return any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for _, m in model.named_modules())


def _dequantize_f32(model: Any) -> Any:
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm.utils import dequantize_model

    model = dequantize_model(model)
    # f16 scales dequantize to f16, which the CPU backend multiplies without BLAS: use f32.
    model.update(tree_map(lambda a: a.astype(mx.float32) if mx.issubdtype(a.dtype, mx.floating) else a,
                          model.parameters()))
    mx.eval(model.parameters())
    return model


def _display_name(spec: str, folder: Path) -> str:
    from engine.models.named import NAMED_MODELS

    if spec in NAMED_MODELS:
        return NAMED_MODELS[spec].label
    return DEMO_NAME if spec == "demo" else folder.name
