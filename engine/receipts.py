"""Receipts: a small JSON that lets anyone replay a reply and check it bit for bit.

A receipt holds what rebuilds the exact request (messages or raw prompt, sampler with its seed,
mode, prefill chunk size, stop strings, context policy and limit), the model (the spec it was
loaded by, its key and name, whether 4-bit weights were expanded: part of the key), the reply
(token ids, logprobs and the SHA-256 of the logprobs as little-endian float32 bytes, finish
reason, text) and the environment it ran in (engine, MLX, mlx-lm, BLAS, platform).

`replay` runs the request again through `Engine.generate` (so through `Engine.prepare`: the same
context fit and message-boundary cuts as the original) and returns a `Verdict`: tokens and
logprob hash equal, or where they part and by how much, plus how this environment differs from
the receipt's. A reply that was stopped is replayed up to where it stopped (the request keeps
its own max tokens: a smaller one could change how the context is fitted).

`python -m engine verify FILE` (engine/cli/verify.py) is the command-line face of `replay`.
"""

from __future__ import annotations

import hashlib
import json
import platform
import struct
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from engine.constraint import Constraint
from engine.documents.document import Document, shown_name
from engine.engine import Engine
from engine.errors import EngineError, RequestError
from engine.types import (
    DEFAULT_CHUNK,
    CancelToken,
    Comparison,
    Event,
    GenerationRequest,
    GenerationResult,
    SamplerSettings,
    TemplateOptions,
    TokenEvent,
    normalize_template_options,
    validate_messages,
)

RECEIPT_FORMAT = "verbatim.receipt"
RECEIPT_VERSION = 1
# A receipt with a constraint (tools, tool_choice, response_format) is version 2: an engine that
# reads only version 1 would replay it unconstrained, so it refuses it instead.
RECEIPT_VERSION_CONSTRAINED = 2
# A receipt with documents (engine/documents) is version 3 (with or without a constraint): their
# text is part of the prompt, and an engine that does not place them would replay another prompt.
RECEIPT_VERSION_DOCUMENTS = 3
# A receipt with template options (GenerationRequest.template_options) is version 4: an engine that
# does not hand them to the chat template would replay another prompt.
RECEIPT_VERSION_TEMPLATE_OPTIONS = 4
RECEIPT_VERSION_NEWEST = RECEIPT_VERSION_TEMPLATE_OPTIONS
ENVIRONMENT_KEYS = ("engine", "mlx", "mlx_lm", "blas", "device", "platform", "python")


class ReceiptError(EngineError):
    """A receipt that cannot be read or replayed (bad file, a model that is not here)."""


def logprobs_sha256(logprobs: Sequence[float]) -> str:
    """SHA-256 of the logprobs as little-endian float32 bytes (the engine samples in float32,
    so this is exact for every reply it produced)."""
    return hashlib.sha256(struct.pack(f"<{len(logprobs)}f", *logprobs)).hexdigest()


def ids_sha256(ids: Sequence[int]) -> str:
    return hashlib.sha256(struct.pack(f"<{len(ids)}i", *ids)).hexdigest()


def environment() -> dict[str, str]:
    """What a replay's arithmetic depends on besides the request and the weights."""
    from importlib import metadata

    import mlx.core as mx

    from engine.blas import blas_library

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "unknown"

    return {
        "engine": version("verbatim"),
        "mlx": getattr(mx, "__version__", version("mlx")),
        "mlx_lm": version("mlx-lm"),
        "blas": blas_library(),
        "device": str(mx.default_device()),
        "platform": f"{platform.system()} {platform.machine()}",
        "python": platform.python_version(),
    }


@dataclass(frozen=True)
class ReceiptModel:
    spec: str  # what Engine.load takes: "demo", a named model, a folder, a .gguf ("" if unknown)
    key: str  # the model key (weights, config, KV options, chunk, dequantized)
    name: str = ""
    dequantized: Optional[bool] = None  # None: let the engine decide per backend


@dataclass
class Receipt:
    messages: Optional[list[dict[str, str]]]
    sampler: SamplerSettings
    model: ReceiptModel
    tokens: list[int]
    logprobs_sha256: str
    logprobs: Optional[list[float]] = None  # optional: lets a mismatch say by how much
    mode: str = "exact"
    chunk: int = DEFAULT_CHUNK
    stop: tuple[str, ...] = ()
    context_policy: str = "refuse"
    context_limit: Optional[int] = None
    prompt: Optional[str] = None  # a raw-text request instead of messages
    finish_reason: str = "stop"
    text: str = ""
    prompt_tokens: Optional[int] = None
    prompt_sha256: Optional[str] = None  # of the prompt's token ids (int32 LE), when known
    environment: dict[str, str] = field(default_factory=dict)
    created_at: str = ""
    # The tools offered and the shape forced on the reply (engine/constraint.py): a replay
    # renders the same tools and decodes under the same grammar.
    constraint: Optional[Constraint] = None
    # The attached documents as the model read them: each one's text, the digest of the file's
    # bytes and of the text (a replay checks the text against it and places it the same way).
    documents: tuple[Document, ...] = ()
    template_options: TemplateOptions = ()  # keyword arguments the chat template was given
    # A server's reply: the request as its client sent it, {"api": "chat.completions" |
    # "completions" | "responses" | "messages", "request": <the JSON body>} (engine verify checks
    # that it still reads as this receipt's request). The request above is what it became.
    wire: Optional[dict[str, Any]] = None

    def request(self, use_cache: bool = True) -> GenerationRequest:
        """The request that produced the reply."""
        return GenerationRequest(
            messages=list(self.messages or []), sampler=self.sampler, mode=self.mode,  # type: ignore[arg-type]
            use_cache=use_cache, stop=self.stop, context_policy=self.context_policy,  # type: ignore[arg-type]
            prompt=self.prompt, constraint=self.constraint, documents=self.documents,
            template_options=self.template_options,
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["sampler"] = self.sampler.to_dict()  # logit_bias as {"id": bias}, absent when empty
        d["stop"] = list(self.stop)
        d.pop("constraint")
        d.pop("documents")
        d.pop("template_options")
        if self.wire is None:
            d.pop("wire")
        version = RECEIPT_VERSION
        if self.constraint is not None:
            d["constraint"] = self.constraint.to_dict()
            version = RECEIPT_VERSION_CONSTRAINED
        if self.documents:
            d["documents"] = [{**doc.to_dict(), "text_sha256": doc.text_digest} for doc in self.documents]
            version = RECEIPT_VERSION_DOCUMENTS
        if self.template_options:
            d["template_options"] = dict(self.template_options)
            version = RECEIPT_VERSION_TEMPLATE_OPTIONS
        return {"format": RECEIPT_FORMAT, "version": version, **d}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, ensure_ascii=False)

    @classmethod
    def from_dict(cls, d: Any) -> "Receipt":
        """Validate and rebuild a receipt; ReceiptError says what is wrong."""
        if not isinstance(d, dict) or d.get("format") != RECEIPT_FORMAT:
            raise ReceiptError(f"not a Verbatim receipt (expected \"format\": \"{RECEIPT_FORMAT}\")")
        if not isinstance(d.get("version"), int) or d["version"] > RECEIPT_VERSION_NEWEST:
            raise ReceiptError(f"receipt version {d.get('version')!r} is newer than this engine reads "
                               f"({RECEIPT_VERSION_NEWEST})")

        def need(key: str, kind: Any, optional: bool = False) -> Any:
            value = d.get(key)
            if value is None and optional:
                return None
            if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
                raise ReceiptError(f"receipt field {key!r} is missing or not {getattr(kind, '__name__', kind)}")
            return value

        model = need("model", dict)
        if not isinstance(model.get("key"), str) or not model["key"]:
            raise ReceiptError("receipt field 'model' has no key")
        messages = d.get("messages")
        prompt = need("prompt", str, optional=True)
        if prompt is None:
            try:
                messages = validate_messages(messages)
            except RequestError as e:
                raise ReceiptError(f"receipt messages: {e}") from None
        sampler_d = need("sampler", dict)
        try:
            sampler = SamplerSettings.from_dict(sampler_d)
        except (TypeError, ValueError) as e:
            raise ReceiptError(f"receipt sampler: {e}") from None
        tokens = need("tokens", list)
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise ReceiptError("receipt tokens must be integers")
        digest = need("logprobs_sha256", str)
        logprobs = need("logprobs", list, optional=True)
        if logprobs is not None:
            if len(logprobs) != len(tokens) or not all(isinstance(x, (int, float)) for x in logprobs):
                raise ReceiptError("receipt logprobs must be one number per token")
            logprobs = [float(x) for x in logprobs]
            if logprobs_sha256(logprobs) != digest:
                raise ReceiptError("receipt logprobs do not match its logprobs_sha256 (the file was edited)")
        mode = d.get("mode", "exact")
        if mode not in ("exact", "fast"):
            raise ReceiptError(f"receipt mode {mode!r} is not exact or fast")
        chunk = need("chunk", int)
        if chunk < 1:
            raise ReceiptError("receipt chunk must be at least 1")
        policy = d.get("context_policy") or "refuse"
        if policy not in ("refuse", "truncate"):
            raise ReceiptError(f"receipt context_policy {policy!r} is not refuse or truncate")
        stop = d.get("stop") or []
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise ReceiptError("receipt stop must be a list of strings")
        env = d.get("environment") or {}
        constraint = None
        if d.get("constraint") is not None:
            try:
                constraint = Constraint.from_dict(d["constraint"])
            except RequestError as e:
                raise ReceiptError(f"receipt constraint: {e}") from None
        elif d["version"] == RECEIPT_VERSION_CONSTRAINED:
            raise ReceiptError("receipt version 2 records a constraint, and this one has none (the file was edited)")
        documents = _documents(d)
        try:
            options = normalize_template_options(d.get("template_options"))
        except RequestError as e:
            raise ReceiptError(f"receipt {e}") from None
        if not options and d["version"] == RECEIPT_VERSION_TEMPLATE_OPTIONS:
            raise ReceiptError("receipt version 4 records template options, and this one has none (the file was "
                               "edited)")
        wire = d.get("wire")
        if wire is not None and (not isinstance(wire, dict) or not isinstance(wire.get("api"), str)
                                 or not isinstance(wire.get("request"), dict)):
            raise ReceiptError("receipt field 'wire' must be {\"api\": ..., \"request\": {...}}")
        return cls(
            messages=messages if prompt is None else None,
            sampler=sampler,
            model=ReceiptModel(str(model.get("spec") or ""), model["key"], str(model.get("name") or ""),
                               model.get("dequantized") if isinstance(model.get("dequantized"), bool) else None),
            tokens=list(tokens),
            logprobs_sha256=digest,
            logprobs=logprobs,
            mode=mode,
            chunk=chunk,
            stop=tuple(stop),
            context_policy=policy,
            context_limit=need("context_limit", int, optional=True),
            prompt=prompt,
            finish_reason=str(d.get("finish_reason") or "stop"),
            text=str(d.get("text") or ""),
            prompt_tokens=need("prompt_tokens", int, optional=True),
            prompt_sha256=need("prompt_sha256", str, optional=True),
            environment={str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {},
            created_at=str(d.get("created_at") or ""),
            constraint=constraint,
            documents=documents,
            template_options=options,
            wire=wire,
        )


def _documents(d: dict[str, Any]) -> tuple[Document, ...]:
    """A receipt's documents, each one's text checked against its recorded digest."""
    raw = d.get("documents")
    if raw is None:
        if d["version"] == RECEIPT_VERSION_DOCUMENTS:
            raise ReceiptError("receipt version 3 records documents, and this one has none (the file was edited)")
        return ()
    if not isinstance(raw, list) or not raw:
        raise ReceiptError("receipt documents must be a non-empty list")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise ReceiptError(f"receipt document {i} is not an object")
        try:
            doc = Document.from_dict(item)
        except RequestError as e:
            raise ReceiptError(f"receipt document {i}: {e}") from None
        if item.get("text_sha256") != doc.text_digest:
            raise ReceiptError(f"receipt document {doc.name!r}: its text does not match its text_sha256 "
                               "(the file was edited)")
        out.append(doc)
    return tuple(out)


def build(request: GenerationRequest, result: GenerationResult, model: ReceiptModel, chunk: int,
          env: Optional[dict[str, str]] = None) -> Receipt:
    """The receipt of `result`, generated for `request` by `model` with prefill chunk `chunk`."""
    if not result.tokens:
        raise ReceiptError("this reply has no tokens: there is nothing to replay")
    context = result.report.context
    return Receipt(
        messages=None if request.prompt is not None else [dict(m) for m in request.messages],
        sampler=replace(request.sampler, seed=result.seed),
        model=model,
        tokens=[int(t) for t in result.tokens],
        logprobs_sha256=logprobs_sha256(result.logprobs),
        logprobs=[float(x) for x in result.logprobs],
        mode=request.mode,
        chunk=chunk,
        stop=tuple(request.stop),
        context_policy=request.context_policy,
        context_limit=context.limit if context is not None else None,
        prompt=request.prompt,
        finish_reason=result.finish_reason,
        text=result.text,
        prompt_tokens=len(result.prompt_ids) if result.prompt_ids else (result.report.prompt_tokens or None),
        prompt_sha256=ids_sha256(result.prompt_ids) if result.prompt_ids else None,
        environment=env if env is not None else environment(),
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        constraint=request.constraint,
        documents=tuple(request.documents),
        template_options=request.template_options,
    )


def write(receipt: Receipt, path: Union[str, Path]) -> None:
    Path(path).write_text(receipt.to_json() + "\n", encoding="utf-8")


def read(path: Union[str, Path]) -> Receipt:
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # a BOM (Windows editors) is fine
    except FileNotFoundError:
        raise ReceiptError(f"receipt not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ReceiptError(f"cannot read {path}: {e}") from None
    return loads(text, str(path))


def loads(text: str, name: str = "receipt") -> Receipt:
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ReceiptError(f"{name} is not valid JSON: {e}") from None
    if isinstance(doc, dict) and isinstance(doc.get("receipt"), dict):
        doc = doc["receipt"]  # e.g. a reply of an exported conversation
    return Receipt.from_dict(doc)


# ------------------------------------------------------------------------------------- replay


@dataclass
class Verdict:
    """How a replay compares with its receipt."""

    ok: bool  # same tokens and the same logprob hash
    comparison: Comparison  # receipt (a) against replay (b)
    tokens: list[int]  # replayed
    logprobs_sha256: str  # of the replay
    logprobs_known: bool  # the receipt lists its logprobs (else max |delta| is unknown)
    environment_diff: list[str]  # "mlx 0.32.4 here, 0.30.0 in the receipt"
    notes: list[str] = field(default_factory=list)  # e.g. the prompt renders differently here
    cache_source: Optional[str] = None  # where the replay's prompt came from (memory/disk/None)
    first_logprob_diff: Optional[int] = None  # same tokens: the first index whose logprob differs (if listed)

    def line(self) -> str:
        """The verdict in one line."""
        c = self.comparison
        n = c.lengths[0]
        if self.ok:
            return f"OK: the replay matches the receipt ({n} tokens, logprobs SHA-256 equal)"
        delta = f"{c.max_logprob_diff:.3g}" if self.logprobs_known else "unknown (the receipt lists no logprobs)"
        if c.first_diff is None:
            at = f" from index {self.first_logprob_diff}" if self.first_logprob_diff is not None else ""
            return f"MISMATCH: same {n} tokens, logprobs differ{at} (max |delta logprob| {delta})"
        chars = f", {c.shared_chars} characters" if c.shared_chars is not None else ""
        return (f"MISMATCH: first divergent token at index {c.first_diff} (shared prefix {c.shared_tokens} tokens"
                f"{chars}; receipt {c.lengths[0]} tokens, replay {c.lengths[1]}); max |delta logprob| over the "
                f"shared prefix {delta}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["verdict"] = self.line()
        return d


def environment_diff(theirs: dict[str, str], ours: Optional[dict[str, str]] = None) -> list[str]:
    ours = ours if ours is not None else environment()
    return [f"{k}: {ours.get(k, '?')} here, {theirs[k]} in the receipt"
            for k in ENVIRONMENT_KEYS if k in theirs and theirs[k] != ours.get(k)]


def open_engine(receipt: Receipt, spec: Optional[str] = None, cache_dir: Optional[Path] = None,
                use_disk: bool = True) -> Engine:
    """An Engine set up as the receipt's was (chunk, weight expansion, context limit) with its
    model loaded. ReceiptError when the model is not here, or is another model (other key)."""
    spec = spec or receipt.model.spec
    key = receipt.model.key
    if not spec:
        raise ReceiptError(f"the receipt names no model spec (key {key}): pass --model")
    eng = Engine(cache_dir=cache_dir, use_disk=use_disk, chunk=receipt.chunk, dequantize=receipt.model.dequantized,
                 context_length=receipt.context_limit)
    try:
        info = eng.load(spec)
    except EngineError as e:
        eng.close()
        raise ReceiptError(f"the receipt's model {spec!r} (key {key}) is not usable here: {e}") from None
    if info.key != key:
        eng.close()
        raise ReceiptError(f"{spec!r} is another model here (key {info.key}, the receipt's is {key}): "
                           "different weights, config or KV options; a replay would not check this receipt")
    return eng


def replay(receipt: Receipt, engine: Engine, use_cache: bool = True, cancel: Optional[CancelToken] = None) -> Verdict:
    """Generate the receipt's request again on `engine` (its model loaded) and compare."""
    stop_after = len(receipt.tokens) if receipt.finish_reason == "cancelled" else None
    token = cancel or CancelToken()

    def on_event(e: Event) -> None:
        if stop_after is not None and isinstance(e, TokenEvent) and e.index + 1 >= stop_after:
            token.cancel()  # the original was stopped here: replay as far, with the same request

    result = engine.generate(receipt.request(use_cache), on_event, token)
    notes = []
    if receipt.prompt_sha256 and result.prompt_ids and ids_sha256(result.prompt_ids) != receipt.prompt_sha256:
        notes.append(f"the prompt renders to other tokens here ({len(result.prompt_ids)} tokens, the receipt's "
                     f"{receipt.prompt_tokens}): tokenizer or chat template differs")
    ref_lps = receipt.logprobs if receipt.logprobs is not None else [0.0] * len(receipt.tokens)
    cmp = Comparison.of(receipt.tokens, ref_lps, result.tokens, result.logprobs, receipt.text or None,
                        result.text if receipt.text else None)
    digest = logprobs_sha256(result.logprobs)
    ok = result.tokens == receipt.tokens and digest == receipt.logprobs_sha256
    if receipt.logprobs is None and result.tokens == receipt.tokens and not ok:
        cmp = replace(cmp, identical=False, detail="same tokens, logprobs differ")
    first_lp = next((i for i, (a, b) in enumerate(zip(ref_lps, result.logprobs)) if a != b), None) \
        if receipt.logprobs is not None and result.tokens == receipt.tokens else None
    ours = getattr(engine, "environment", None)  # a server's (engine/remote.py), else this process's
    return Verdict(ok, cmp, list(result.tokens), digest, receipt.logprobs is not None,
                   environment_diff(receipt.environment, ours if isinstance(ours, dict) else None), notes,
                   result.report.source, first_lp)


def describe(receipt: Receipt) -> str:
    """One line about what a receipt replays."""
    s = receipt.sampler
    what = f"{len(receipt.messages or [])} messages" if receipt.prompt is None else "a raw prompt"
    return (f"{receipt.model.name or receipt.model.spec} ({receipt.model.key[:12]}), {what}, {receipt.mode} mode, "
            f"chunk {receipt.chunk}, seed {s.seed}, T {s.temperature:g}, {len(receipt.tokens)} tokens "
            f"({receipt.finish_reason})" + (f", constrained ({_constraint_note(receipt.constraint)})"
                                            if receipt.constraint is not None else "")
            + (f", {len(receipt.documents)} documents ({', '.join(shown_name(d.name) for d in receipt.documents)})"
               if receipt.documents else ""))


def _constraint_note(c: Constraint) -> str:
    parts = [f"{len(c.tools)} tools, tool_choice {c.function or c.tool_choice}"] if c.tools else []
    if c.response_format is not None:
        parts.append(f"response_format {c.response_format['type']}")
    return ", ".join(parts)


__all__ = [
    "RECEIPT_FORMAT", "Receipt", "ReceiptError", "ReceiptModel", "Verdict", "build", "describe",
    "environment", "environment_diff", "logprobs_sha256", "loads", "open_engine", "read", "replay", "write",
]  # fmt: skip
