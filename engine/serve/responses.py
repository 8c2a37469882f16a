"""The server's answers in OpenAI's shapes: whole replies and stream chunks, usage, logprobs,
the system fingerprint, and the `verbatim` object (what the prompt cache did). Requests come
validated from schema.py; nothing here reads a request body. No aiohttp and no MLX.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, Optional

from engine.serve.schema import ParsedRequest
from engine.types import CacheReport, GenerationResult, PrefillProgress, RestoreEvent

# An absolute path (POSIX or Windows) not glued to a word before it ("n/a", "1/2" stay).
_PATH_RE = re.compile(r"(?<![\w.~/\\])(?:/|[A-Za-z]:[\\/])[^\s;,()'\"]*?(?=[:.]*(?:[\s;,()'\"]|$))")


def no_paths(text: str) -> str:
    """`text` with absolute file system paths replaced by '<path>': responses never show where
    the model or the cache lives (a disk-cache warning, an engine error)."""
    return _PATH_RE.sub("<path>", text)



def verbatim_report(result: GenerationResult, queue: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The `verbatim` object: what the prompt cache did, and the seed actually used."""
    out = report_fields(result.report)
    out.update(seed=result.seed, token_ids=list(result.tokens), finish_reason=result.finish_reason)
    if queue is not None:
        out["queue"] = queue
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


def usage(result: GenerationResult) -> dict[str, Any]:
    n_prompt, n_out = result.report.prompt_tokens, len(result.tokens)
    return {
        "prompt_tokens": n_prompt,
        "completion_tokens": n_out,
        "total_tokens": n_prompt + n_out,
        "prompt_tokens_details": {"cached_tokens": result.report.restored},
    }


def finish_reason(result: GenerationResult) -> str:
    return "length" if result.finish_reason == "length" else "stop"


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


def chat_logprob_entries(entries: list[TokenLogprob]) -> list[dict[str, Any]]:
    return [
        {
            "token": e.token[0],
            "logprob": e.logprob,
            "bytes": e.token[1],
            "top_logprobs": [{"token": t[0], "logprob": lp, "bytes": t[1]} for t, lp in (e.top or [])],
        }
        for e in entries
    ]


def completion_logprobs(entries: list[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """The legacy completions logprobs object (text_offset counts from `offset`)."""
    offsets, pos = [], offset
    for e in entries:
        offsets.append(pos)
        pos += len(e.token[0])
    return {
        "tokens": [e.token[0] for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [({t[0]: lp for t, lp in e.top} if e.top is not None else None) for e in entries],
        "text_offset": offsets,
    }


def full_response(p: ParsedRequest, model: str, result: GenerationResult, entries: Optional[list[TokenLogprob]],
                  queue: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """A whole (non-streamed) chat.completion or text_completion object."""
    if p.kind == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": result.text},
            "logprobs": {"content": chat_logprob_entries(entries)} if entries is not None else None,
            "finish_reason": finish_reason(result),
        }
        obj = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": result.text,
            "logprobs": completion_logprobs(entries) if entries is not None else None,
            "finish_reason": finish_reason(result),
        }
        obj = "text_completion"
    return {
        "id": p.id,
        "object": obj,
        "created": p.created,
        "model": model,
        "system_fingerprint": fingerprint(result.report.model_key),
        "choices": [choice],
        "usage": usage(result),
        "verbatim": verbatim_report(result, queue),
    }


def chunk(p: ParsedRequest, model: str, text: Optional[str], entries: Optional[list[TokenLogprob]],
          finish: Optional[str] = None, role: bool = False, text_offset: int = 0) -> dict[str, Any]:
    """One streamed chunk: a text delta and the logprobs of the tokens it covers."""
    if p.kind == "chat":
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "logprobs": {"content": chat_logprob_entries(entries)} if entries is not None else None,
            "finish_reason": finish,
        }
        obj = "chat.completion.chunk"
    else:
        choice = {
            "index": 0,
            "text": text or "",
            "logprobs": completion_logprobs(entries, text_offset) if entries is not None else None,
            "finish_reason": finish,
        }
        obj = "text_completion"
    return {"id": p.id, "object": obj, "created": p.created, "model": model, "choices": [choice]}
