"""What every wire format's answer carries: the `verbatim` object (what the prompt cache did, the
seed used, the request fields that changed nothing), the prompt's split into restored / newly
stored / the rest (each format's usage), the system fingerprint, and token logprobs as text and
bytes. No aiohttp and no MLX.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, Optional, Sequence

from engine.types import CacheReport, GenerationResult, PrefillProgress, RestoreEvent

# An absolute path (POSIX or Windows) not glued to a word before it ("n/a", "1/2" stay).
_PATH_RE = re.compile(r"(?<![\w.~/\\])(?:/|[A-Za-z]:[\\/])[^\s;,()'\"]*?(?=[:.]*(?:[\s;,()'\"]|$))")


def no_paths(text: str) -> str:
    """`text` with absolute file system paths replaced by '<path>': responses never show where
    the model or the cache lives (a disk-cache warning, an engine error)."""
    return _PATH_RE.sub("<path>", text)


def verbatim_report(result: GenerationResult, queue: Optional[dict[str, Any]] = None,
                    ignored: Sequence[str] = (), receipt: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The `verbatim` object: what the prompt cache did, the seed actually used, the request's
    fields that were accepted and changed nothing (`ignored`), and the receipt when asked for."""
    out = report_fields(result.report)
    out.update(seed=result.seed, token_ids=list(result.tokens), finish_reason=result.finish_reason,
               ignored=list(ignored))
    if queue is not None:
        out["queue"] = queue
    if receipt is not None:
        out["receipt"] = receipt
    return out


def progress_fields(event: "RestoreEvent | PrefillProgress") -> dict[str, Any]:
    """A `verbatim.progress` stream's chunk body for a restore or a prefill step (schema.verbatim_flag)."""
    if isinstance(event, RestoreEvent):
        return {"restore": {**report_fields(event.report), "planned": [list(c) for c in event.planned]}}
    return {"prefill": {"done": event.done, "total": event.total}}


def report_fields(r: CacheReport) -> dict[str, Any]:
    """A cache report as the `verbatim` object carries it (paths left out of the texts)."""
    offsets = list(r.layer_offsets)
    known = [o for o in offsets if o is not None]
    out: dict[str, Any] = {
        "prompt_tokens": r.prompt_tokens,
        "matched": r.matched,
        "restored": r.restored,
        "stored": r.stored,
        "snapshot_id": r.snapshot_id,
        "partial": r.partial,
        "source": r.source,
        "declines": [no_paths(d) for d in r.declines],
        "layer_offsets": offsets,
        "layer_offsets_summary": {
            "layers": len(offsets),
            "min": min(known) if known else None,
            "max": max(known) if known else None,
            "without_offset": len(offsets) - len(known),
        },
        "layers": [asdict(x) for x in r.layers],  # index, cache class, offset, size, trimmable
        "prefill_tokens": r.prefill_tokens,
        "chunks": [list(c) for c in r.chunks],  # the prefill forwards [start, end)
        "message_starts": list(r.message_starts),
        "reply_header_cuts": list(r.reply_header_cuts),
        "snapshots_stored": [{k: s.get(k) for k in ("kind", "length", "canonical")} for s in r.snapshots_stored],
        "context": asdict(r.context) if r.context is not None else None,
        "mode": r.mode,
        "chunk_size": r.chunk_size,
        "seed": r.seed,
        "sampler": dict(r.sampler),
        "identical_to_previous": r.identical,
        "first_diff": r.first_diff,
        "ttft_s": r.ttft_s,
        "prefill_tps": r.prefill_tps,
        "decode_tps": r.decode_tps,
        "model_key": r.model_key,
        "warnings": [no_paths(w) for w in r.warnings],
        "world_size": r.world_size,
    }
    if r.documents:  # each attached document: where it lies in the prompt, where its state came from
        out["documents"] = [dict(d) for d in r.documents]
    if r.continued_from:  # a Continue: the reply's text is that many characters of the reply so far + this
        out.update(continued_from=r.continued_from, continued_chars=r.continued_chars,
                   continue_note=no_paths(r.continue_note))
    if r.ranks:  # a distributed run: each rank's own cache report (engine/distributed/report.py)
        out["ranks"] = [dict(x) for x in r.ranks]
    return out


def cache_split(result: GenerationResult) -> tuple[int, int, int]:
    """The prompt's tokens as (restored, newly stored, the rest): restored from the cache, stored
    into it by this request (the longest snapshot it stored, as far as it covers the prompt, past
    what was restored), and neither. The three add up to the prompt's tokens (Anthropic's
    cache_read_input_tokens, cache_creation_input_tokens, input_tokens)."""
    r = result.report
    prompt = r.prompt_tokens
    covered = max((int(s.get("length") or 0) for s in r.snapshots_stored), default=0)
    created = max(0, min(prompt, covered) - r.restored)
    return r.restored, created, prompt - r.restored - created


def fingerprint(model_key: str) -> str:
    return f"verbatim-{model_key[:16]}"


# Token text for logprobs: computed on the engine thread by the job (it owns the tokenizer) and
# carried as (text, bytes) pairs next to each logprob.
TokenText = tuple[str, list[int]]


@dataclass
class TokenLogprob:
    token: TokenText
    logprob: float
    top: Optional[list[tuple[TokenText, float]]] = None
