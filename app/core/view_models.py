"""View models: what the chat view and the debug panel show, computed from store rows (no Qt)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from app.core.store import Message


@dataclass(frozen=True)
class MessageVM:
    id: int
    role: str  # "user" | "assistant" | "system"
    content: str
    status: str  # "complete" | "generating" | "interrupted"
    variant: int  # 1-based position among siblings
    variants: int
    prev_id: Optional[int]  # sibling ids for the "< 2 / 3 >" navigator
    next_id: Optional[int]
    footer: str = ""  # tokens, TTFT, tok/s, cache line
    identity: str = ""  # "identical to previous" / "differs from previous at token N"
    identical: Optional[bool] = None
    seed: Optional[int] = None
    model_name: Optional[str] = None
    report: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def navigator(self) -> str:
        return f"{self.variant} / {self.variants}"


def message_vm(m: Message, sibling_ids: list[int]) -> MessageVM:
    i = sibling_ids.index(m.id) if m.id in sibling_ids else 0
    report = m.cache_report or {}
    return MessageVM(
        id=m.id,
        role=m.role,
        content=m.content,
        status=m.status,
        variant=i + 1,
        variants=max(len(sibling_ids), 1),
        prev_id=sibling_ids[i - 1] if i > 0 else None,
        next_id=sibling_ids[i + 1] if i + 1 < len(sibling_ids) else None,
        footer=footer_text(m) if m.role == "assistant" else "",
        identity=identity_text(report) if m.role == "assistant" else "",
        identical=report.get("identical"),
        seed=m.seed,
        model_name=m.model_name,
        report=report,
    )


def format_seconds(s: Optional[float]) -> str:
    if s is None:
        return "–"
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"


def footer_text(m: Message) -> str:
    """'64 tokens · TTFT 31 ms · 148.2 tok/s · cache: restored 170 / 171'."""
    if m.status == "generating":
        return "generating…"
    r = m.cache_report or {}
    if not r:
        return "stopped" if m.status == "interrupted" else ""
    n = len(m.tokens or [])
    parts = [f"{n} token{'s' if n != 1 else ''}"]
    if n:
        parts.append(f"TTFT {format_seconds(r.get('ttft_s'))}")
        parts.append(f"{r.get('decode_tps') or 0:.1f} tok/s")
    parts.append(f"cache: restored {r.get('restored', 0)} / {r.get('prompt_tokens', 0)}")
    if m.status == "interrupted":
        parts.append("stopped" if n else "stopped before the first token")
    elif m.finish_reason == "length":
        parts.append("max tokens reached")
    return " · ".join(parts)


def identity_text(report: dict[str, Any]) -> str:
    ident = report.get("identical")
    if ident is None:
        return ""
    if ident:
        return "identical to previous"
    first = report.get("first_diff")
    if first is None:
        return f"same tokens, logprobs differ by {report.get('max_logprob_diff', 0):.3g}"
    return f"differs from previous at token {first}"


def format_bytes(n: Optional[float]) -> str:
    if n is None:
        return "–"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"
