"""The engine facade that the CLI and the GUI both use.

One `Engine` per worker thread: MLX streams are thread-local, so the model, its caches and
every array must be created on the thread that uses them (docs/architecture.md). The GUI runs an Engine
on its worker thread; the CLI and tests use it directly.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Generator, Iterable, Optional

from engine.cache.disk.tier import DiskCache
from engine.cache.eviction import DocumentsKept
from engine.cache.families import class_names
from engine.cache.kinds import SnapshotKind
from engine.cache.namespace import cache_key, is_key_of
from engine.cache.prompt_cache import PromptCache
from engine.documents.extract import Document
from engine.errors import EngineError, GGUFError, ModelError
from engine.generate.constraints import tool_format
from engine.generate.loop import drain, stream
from engine.generate.model import LoadedModel
from engine.generate.prepare import Prepared, PromptBuilder
from engine.generate.templating import control_tokens, render_prompt, token_pieces
from engine.memory import (
    MLX_CACHE_LIMIT,
    MemoryReport,
    current_mlx_cache_limit,
    default_memory_budget,
    limit_mlx_cache,
    physical_memory,
    process_rss,
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
    CancelToken,
    Comparison,
    ContextInfo,
    Event,
    EventCallback,
    GenerationRequest,
    GenerationResult,
    validate_messages,
)

_PREVIOUS_KEPT = 256  # replies remembered for "identical to previous"


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
        memory_budget: Optional[int] = None,
        chunk: int = DEFAULT_CHUNK,
        disk_budget: Optional[int] = None,
        dequantize: Optional[bool] = None,
        context_length: Optional[int] = None,
        shard: Optional[Callable[[Any], dict[str, Any]]] = None,
        mlx_cache_limit: Optional[int] = MLX_CACHE_LIMIT,
    ) -> None:
        """`memory_budget`: bytes of snapshots the prompt cache keeps in memory (None: sized to the
        machine, engine/memory.py; set_memory_budget changes it later). `mlx_cache_limit`: MLX's
        buffer cache bound, process-wide (None: leave MLX's own)."""
        if chunk < 1:
            raise EngineError("chunk size must be at least 1")
        if mlx_cache_limit is not None:
            limit_mlx_cache(mlx_cache_limit)
        if memory_budget is None:
            memory_budget = default_memory_budget()
        self.chunk = chunk
        self.dequantize = dequantize  # None: decide per backend (see _should_dequantize)
        self.context_length = context_length  # overrides the model's own context length
        # Distributed runs only (engine/distributed/shard.py): splits the loaded model over the
        # ranks in place and returns the sharding's identity, which joins the model key.
        self.shard = shard
        self._builder: Optional[PromptBuilder] = None  # the loaded model's request path (prepare.py)
        disk = None
        # Which snapshots both tiers drop first: documents' states last while in use (keep_documents).
        self.eviction = DocumentsKept()
        if use_disk:
            disk = DiskCache(cache_dir, budget_bytes=disk_budget, policy=self.eviction)
        self.cache = PromptCache(memory_budget, disk, self.eviction)
        self.lm: Optional[LoadedModel] = None
        self.info: Optional[ModelInfo] = None
        self._weights_bytes = 0  # the loaded model's parameters (memory_report)
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
            controls=control_tokens(tokenizer, eos),
        )
        self._builder = PromptBuilder(self.lm)
        self._weights_bytes = _parameter_bytes(model)
        import mlx.core as mx

        # The load's temporaries (a dequantized model's packed weights, a shard's other parts) are
        # buffers of sizes nothing asks for again: out of MLX's buffer cache, back to the system.
        mx.clear_cache()
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

    def preload_documents(self, every_namespace: bool = False) -> int:
        """Read the states that are kept warm from the disk into memory while they fit (the memory
        budget bounds it): the documents' (keep_documents) and long system turns' (a harness's
        system prompt and tools: generate/prepare.py, kept_points). After a restart the first
        question about a document, or a harness's first session, restores it from memory. The
        window runs this once a model is loaded, for its own conversations (no namespace);
        `engine serve` at start with `every_namespace` (each API key's, and keyless clients').
        The number of snapshots read."""
        lm = self._lm()
        own = cache_key(lm.key, None)
        return len(self.cache.preload((lambda k: is_key_of(lm.key, k)) if every_namespace else (lambda k: k == own),
                                      lambda m: m.kind == SnapshotKind.DOCUMENT and self.eviction.keep_priority(m) > 0))

    def measure(self, request: GenerationRequest) -> ContextInfo:
        """The whole prompt of `request` in tokens (nothing left out, nothing refused) and the
        limit in force for it: what a context meter counts before Send; prepare() then fits it."""
        return self.builder.measure(request, self.limit_for(request))

    def document_tokens(self, documents: tuple[Document, ...], system_prompt: str = "") -> list[int]:
        """What each document costs in a conversation with `system_prompt` about them: the tokens
        its block adds to the prompt, its name and the separator before it included. The same
        number a refusal gives for it and the report's span (engine/documents/placement.py,
        `document_costs`): what a document's chip shows."""
        return self.builder.document_tokens(tuple(documents), system_prompt)

    def prepare(self, request: GenerationRequest) -> Prepared:
        """The request as it will run (engine/generate/prepare.py): validated, its prompt rendered
        (the chat through the template, or raw text as is), fitted into the context (or refused
        with a one-line error before any prefill), and its schedule's cuts."""
        return self.builder.prepare(request, self.limit_for(request))

    def stream(self, request: GenerationRequest, cancel: Optional[CancelToken] = None
               ) -> Generator[Event, None, GenerationResult]:
        """Generate a reply: yields a RestoreEvent, PrefillProgress and TokenEvents, returns the
        GenerationResult."""
        lm, path = self._lm(), self.builder
        p = path.prepare(request, self.limit_for(request))
        with self.cache.generation():  # the prompt cache decides when its disk tier writes
            result = yield from stream(lm, p, self.cache, self.chunk, cancel, path.guide(p))
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
             constraint, request.template_options)
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
        path = self.builder
        p = path.prepare(request, self.limit_for(request))
        return drain(stream(self._lm(), replace(p, request=replace(p.request, use_cache=False)), None, self.chunk,
                            cancel, path.guide(p)))

    def token_texts(self, tokens: list[int]) -> list[str]:
        """The text each token of a reply adds, for showing it token by token (display only)."""
        return token_pieces(self._lm().tokenizer, tokens)

    # -- cache ---------------------------------------------------------------------------------
    def cache_stats(self) -> dict[str, Any]:
        return self.cache.stats()

    def clear_cache(self) -> None:
        self.cache.clear()
        self._previous.clear()

    def set_memory_budget(self, budget_bytes: int) -> None:
        """The prompt cache's memory budget from now on (bytes): a smaller one evicts at once."""
        try:
            self.cache.set_memory_budget(int(budget_bytes))
        except ValueError as e:
            raise EngineError(str(e)) from e

    def memory_report(self) -> MemoryReport:
        """Where this process's memory is: the model's weights, the live KV cache kept for a
        regenerate, the prompt cache's memory tier and its budget, MLX's active memory and buffer
        cache, and the process's RSS (engine/memory.py). Only counters are read: callable from
        any thread, as cache_stats is."""
        import mlx.core as mx

        mem = self.cache.memory.stats()
        return MemoryReport(
            weights=self._weights_bytes, live_kv=self.cache.spare_bytes(), tier=mem["bytes"],
            tier_budget=self.cache.budget_bytes, tier_entries=mem["entries"],
            mlx_active=int(mx.get_active_memory()), mlx_cache=int(mx.get_cache_memory()),
            mlx_cache_limit=current_mlx_cache_limit(), mlx_peak=int(mx.get_peak_memory()), rss=process_rss())

    def close(self) -> None:
        self.cache.close()

    def _lm(self) -> LoadedModel:
        if self.lm is None:
            raise EngineError("no model loaded")
        return self.lm

    @property
    def builder(self) -> PromptBuilder:
        """The loaded model's request path: prepares requests, holds its compiled grammars."""
        if self._builder is None:
            raise EngineError("no model loaded")
        return self._builder


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

    return mx.default_device() == mx.cpu and f32_bytes <= DEQUANTIZE_MAX_RAM_FRACTION * physical_memory()


def _parameter_bytes(model: Any) -> int:
    """Bytes of the model's parameters as loaded (expanded, when they were dequantized)."""
    from mlx.utils import tree_flatten

    return sum(p.nbytes for _, p in tree_flatten(model.parameters()))


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
