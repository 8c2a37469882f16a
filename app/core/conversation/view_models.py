"""View models: what the chat view, the footer, the status bar and the debug panel show (no Qt).

Every word the app says about a reply's report lives here, once: the footer under a reply, its
"identical to previous" line, the status line when a reply ends, the debug panel's rows, the
cold-run verdict. Inputs are typed: the engine's `CacheReport` and the session's `ReplyOutcome`
(rebuilt from the stored row by `Message.report` / `Message.outcome`), never string keys.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Optional, Sequence

from app.core.store import Action, Message, ReplyOutcome, Run, continuable
from engine.documents.extract import Document
from engine.types import CacheReport, Comparison, GenerationResult


@dataclass(frozen=True)
class ConversationItem:
    """One row of the conversation list."""

    id: int
    title: str
    subtitle: str = ""  # a search snippet, or when it was last used
    hit_id: Optional[int] = None  # a search hit's message (the window scrolls to it)


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
    tokens: int = 0  # token ids stored with the reply (the context meter and the inspector)
    # The latest run's report and outcome (what the footer and the debug panel show), every run.
    report: Optional[CacheReport] = field(default=None, compare=False, hash=False)
    outcome: ReplyOutcome = field(default_factory=ReplyOutcome, compare=False, hash=False)
    runs: tuple[Run, ...] = field(default=(), compare=False, hash=False)
    run_lines: tuple[str, ...] = ()  # one footer line per run, oldest first (the runs menu)
    settings_note: str = ""  # what Regenerate and New variant use (the footer's tooltip)
    shown: Optional[int] = None  # the run shown (an index of `runs`, picked in the runs menu); None: the latest
    continuable: bool = False  # stopped, or ended at max tokens: Continue goes on with it (continuing.py)
    documents: tuple[Document, ...] = field(default=(), compare=False, hash=False)  # a user message's files

    @property
    def navigator(self) -> str:
        return f"{self.variant} / {self.variants}"

    @property
    def badge(self) -> str:
        """The identity line as shown under the reply: '✓ identical to previous'."""
        if not self.identity:
            return ""
        return {"same": "✓ ", "diff": "≠ ", "near": "≈ "}.get(self.badge_state, "") + self.identity

    @property
    def badge_state(self) -> str:
        """'same' (identical), 'diff' (other tokens), 'near' (same tokens, other logprobs: fast
        mode may do that), 'info' (nothing compared: a new seed)."""
        return badge_state(self.outcome)


def message_vm(m: Message, sibling_ids: list[int], runs: Sequence[Run] = (),
               documents: Sequence[Document] = ()) -> MessageVM:  # fmt: skip
    """A message as shown; a reply's footer, badge and report are its latest run's."""
    i = sibling_ids.index(m.id) if m.id in sibling_ids else 0
    assistant = m.role == "assistant"
    latest = runs[-1] if runs else None
    outcome = latest.outcome if latest is not None else m.outcome
    report = latest.report if latest is not None else None
    lines = tuple(run_text(m, r, k + 1, len(runs)) for k, r in enumerate(runs))
    return MessageVM(
        id=m.id,
        role=m.role,
        content=m.content,
        status=m.status,
        variant=i + 1,
        variants=max(len(sibling_ids), 1),
        prev_id=sibling_ids[i - 1] if i > 0 else None,
        next_id=sibling_ids[i + 1] if i + 1 < len(sibling_ids) else None,
        footer=(lines[-1] if lines else footer_text(m)) if assistant else "",
        identity=(continue_text(report) if outcome.action == Action.CONTINUE and report is not None
                  else identity_text(outcome, mode=report.mode if report else "exact")) if assistant else "",
        identical=outcome.comparison.identical if outcome.comparison is not None else None,
        seed=m.seed,
        model_name=m.model_name,
        tokens=len(m.tokens or []),
        report=report,
        outcome=outcome,
        runs=tuple(runs),
        run_lines=lines,
        settings_note=settings_note(m) if assistant else "",
        continuable=assistant and continuable(m.status, m.finish_reason, len(m.tokens or [])),
        documents=tuple(documents),
    )


def run_shown(vm: MessageVM, k: int) -> MessageVM:
    """`vm` showing its run `k` (0: the first), picked in the runs menu: its footer, badge and
    report are that run's, so the footer and the debug panel show the same run."""
    if not 0 <= k < len(vm.runs) - 1:
        return vm  # the latest run: as built
    run = vm.runs[k]
    c = run.outcome.comparison
    identity = (continue_text(run.report) if run.outcome.action == Action.CONTINUE
                else identity_text(run.outcome, mode=run.report.mode))
    return replace(vm, footer=vm.run_lines[k], identity=identity,
                   identical=c.identical if c is not None else None, report=run.report,
                   outcome=run.outcome, shown=k)  # fmt: skip


# ------------------------------------------------------------------------------- formatting
def format_seconds(s: Optional[float]) -> str:
    if s is None:
        return "–"
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"


def format_bytes(n: Optional[float]) -> str:
    if n is None:
        return "–"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


# ----------------------------------------------------------------------- under a reply, status
def footer_text(m: Message) -> str:
    """The footer of a reply with no finished run: generating, or cut short (a crash keeps its
    tokens: '12 tokens · stopped (not finished)')."""
    if m.status == "generating":
        return "generating…"
    if m.status != "interrupted":
        return ""
    n = len(m.tokens or [])
    return f"{n} token{'s' if n != 1 else ''} · stopped (not finished)" if n else "stopped"


def run_text(m: Message, run: Run, k: int = 1, runs: int = 1) -> str:
    """One run under a reply: 'run 2 of 2 · 64 tokens · TTFT 31 ms · 148.2 tok/s · cache:
    restored 170 / 171 (memory)'; the run number only when the reply has more than one."""
    r = run.report
    n = run.n_tokens
    parts = [f"run {k} of {runs}"] if runs > 1 else []
    parts.append(f"{n} token{'s' if n != 1 else ''}")
    if n:
        parts.append(f"TTFT {format_seconds(r.ttft_s)}")
        parts.append(f"{r.decode_tps or 0:.1f} tok/s")
    parts.append(f"cache: restored {restored_of(r)}" + (f" ({r.source})" if r.source else ""))
    if run.finish_reason == "cancelled" or (k == runs and m.status == "interrupted"):
        parts.append("stopped" if n else "stopped before the first token")
    elif run.finish_reason == "length":
        parts.append("max tokens reached")
    elif run.finish_reason == "context":
        parts.append("the model's context is full")
    return " · ".join(parts)


def settings_note(m: Message) -> str:
    """What Regenerate and New variant will use for this reply (the footer's tooltip)."""
    sampler = m.sampler or {}
    mode = (m.cache_report or {}).get("mode") or "exact"
    own = f"seed {m.seed if m.seed is not None else '–'}, {mode}, T {sampler.get('temperature', '–')}"
    return (f"Regenerate (Ctrl+R) repeats this reply's own settings ({own}): the same tokens again.\n"
            "New variant (Ctrl+Shift+R) uses the current settings and a fresh seed.")


FAST_NOTE = "fast mode reuses decoded states; exact mode would not"


def badge_state(outcome: ReplyOutcome) -> str:
    c = outcome.comparison
    if c is None:
        return "info"
    if c.identical:
        return "same"
    return "near" if c.first_diff is None else "diff"


def identity_text(outcome: ReplyOutcome, long: bool = False, mode: str = "exact") -> str:
    """How a reply compares with the variant it replaced: the line under the reply, or (long)
    the debug panel's wording. A new variant (new seed) is compared with nothing; a regenerate of
    a stopped reply over the stopped one's length; fast mode's logprob drift is explained."""
    c = outcome.comparison
    if outcome.duplicate_of is not None:
        return ("identical to an existing variant: selected it instead of adding a copy" if long
                else "identical to an existing variant (not added again)")
    if c is None:
        if outcome.action == Action.VARIANT:
            return "new seed (a new variant is not compared with the others)" if long else "new seed"
        return "no previous variant with the same prompt and settings" if long else ""
    if c.identical:
        if c.upto is not None and c.lengths is not None and c.lengths[1] < c.lengths[0]:  # this one stopped
            return (f"identical to previous as far as this one got ({c.upto} tokens, bit-equal logprobs;"
                    " it was stopped)" if long else "identical to previous as far as it got")
        if c.upto is not None:
            return f"identical up to where the first one stopped ({c.upto} tokens)" if long else \
                "identical up to where the first one stopped"
        return "identical to previous (same tokens, bit-equal logprobs)" if long else "identical to previous"
    if c.first_diff is None:
        text = f"same tokens, logprobs differ by{' up to' if long else ''} {c.max_logprob_diff:.3g}"
        text = text + (f" ({FAST_NOTE})" if long else " (fast mode)") if mode == "fast" else text
    else:
        text = f"differs from previous at token {c.first_diff}"
    return text + world_size_note(outcome.world_sizes, long)


def restored_of(r: Any) -> str:
    """'64 / 65': restored of what the run had to hold before its first new token: the prompt, and
    for a Continue the reply so far too ('64 / 65 (prompt 41 + 24 of the reply)')."""
    if getattr(r, "continued_from", 0):
        held = r.prompt_tokens + r.continued_from
        return f"{r.restored} / {held} (prompt {r.prompt_tokens} + {r.continued_from} of the reply)"
    return f"{r.restored} / {r.prompt_tokens}"


def no_restore_reason(r: Any) -> str:
    """Why a run that matched a stored prefix restored none of it, when no snapshot was declined
    ('' otherwise): exact mode restores only at a point where a cold prefill of this prompt
    would cut too (engine/cache/planner.py, reuse_point), and none lay inside the match."""
    if r.restored or not r.matched or r.declines or getattr(r, "mode", "exact") != "exact":
        return ""
    return (f"no exact cut inside the {r.matched} matched tokens: exact mode restores only where a cold "
            "prefill of this prompt cuts too")


def continue_text(r: CacheReport, long: bool = False) -> str:
    """The badge of a continued reply: from which token, and how the cache got there. Exact mode
    promises the unstopped run's reply (tests/engine/test_continue.py); fast mode does not."""
    n = r.continued_from
    if not n:
        return "continued"
    restored = r.restored == r.prompt_tokens + n - 1
    how = (f"restored {r.restored}, 1 token run" if restored
           else f"recomputed {r.prompt_tokens + n - 1 - r.restored} with the same forwards")
    if r.mode != "exact":
        text = f"continued from token {n} ({how}; fast mode: may differ from an unstopped run)"
    else:
        text = f"continued from token {n}: identical to an unstopped run ({how})"
    return text + (f" — {r.continue_note}" if long and r.continue_note else "")


def world_size_note(sizes: Optional[tuple[int, int]], long: bool) -> str:
    """Why a regenerate made on another number of ranks may differ: the ranks sum in another order."""
    if sizes is None:
        return ""
    ranks = [f"{n} rank{'s' if n != 1 else ''}" for n in sizes]
    if not long:
        return f" (on {ranks[1]}, the previous on {ranks[0]})"
    return (f" — made on {ranks[1]}, the previous one on {ranks[0]}: another world size sums the"
            " layers in another order, so the bits may differ (regenerate on the same ranks to compare)")


def prefill_rate_text(r: CacheReport) -> str:
    """The prefill rate, only where it measures a prefill: a regenerate runs one or a few
    tokens (the rest restored), whose 'rate' is a forward's latency, not a slow prefill."""
    if r.prefill_tokens < PREFILL_RATE_MIN_TOKENS:  # the reason there is no rate, and what was timed
        n = r.prefill_tokens
        took = f" in {format_seconds(n / r.prefill_tps)}" if n and r.prefill_tps else ""
        return (f"no rate: {n} token{'s' if n != 1 else ''} run{took} ({r.restored:,} restored), too few "
                f"(under {PREFILL_RATE_MIN_TOKENS}) to measure prefill speed")
    return f"{r.prefill_tps or 0:.1f} tok/s"


PREFILL_RATE_MIN_TOKENS = 16  # fewer prompt tokens run than this: no rate shown


def settings_summary(s: Any, selected: Optional[MessageVM]) -> str:
    """The bar above the composer: the settings a send or new variant uses, and what Regenerate
    uses when the selected reply was made otherwise (it repeats the reply's own settings)."""
    seed = "random seed" if s.random_seed else f"seed {s.sampler.seed}"
    text = f"{s.mode} · T {s.sampler.temperature:g} · {seed} · max {s.sampler.max_tokens}"
    own = selected.report.mode if selected is not None and selected.report is not None else None
    if own is not None and own != s.mode:
        return f"new: {text} · regenerate: {own}, as the reply"
    return text


PROGRESS_VERBS = {Action.REGENERATE: "Regenerating", Action.VARIANT: "New variant", Action.CONTINUE: "Continuing"}


def progress_text(action: Action, seed: int) -> str:
    """The status line while a reply is generated."""
    verb = PROGRESS_VERBS.get(action, "Generating")
    return f"{verb}… (seed {seed})"


def finished_text(result: GenerationResult, outcome: ReplyOutcome) -> str:
    """The status line when a reply ends: '24 tokens · restored 170 / 171 · identical to previous'."""
    rep = result.report
    msg = f"{len(result.tokens)} tokens · restored {restored_of(rep)}"
    c = outcome.comparison
    if result.finish_reason == "cancelled":
        return "Stopped · " + msg
    if outcome.duplicate_of is not None:
        return msg + " · identical to an existing variant: selected it, no copy added"
    if outcome.action == Action.CONTINUE:
        return msg + " · " + continue_text(rep)
    if outcome.action == Action.VARIANT:
        return msg + " · new seed"
    if c is not None:
        same_tokens = c.identical or c.first_diff is None
        msg += " · " + (identity_text(outcome, mode=rep.mode) if same_tokens else "differs from previous")
    return msg


def verify_text(cmp: Comparison) -> str:
    """The cold run's verdict in the debug panel."""
    return ("✓ " if cmp.identical else "≠ ") + cmp.detail


# --------------------------------------------------------------------------------- debug panel
REPORT_FIELDS = [
    ("prompt_tokens", "Prompt tokens"),
    ("context", "Context"),
    ("matched", "Matched prefix"),
    ("restored", "Restored"),  # of the prompt, as the footer and the status bar say it
    ("snapshot_length", "Snapshot length"),  # the length of the snapshot it came from
    ("partial", "Partial restore"),
    ("source", "Source"),
    ("mode", "Mode"),
    ("chunk_size", "Chunk size"),
    ("prefill_tokens", "Prefill tokens"),
    ("chunks", "Prefill chunks"),
    ("snapshots", "Snapshots stored"),
    ("seed", "Seed"),
    ("sampler", "Sampler"),
    ("model_key", "Model key"),
]
TIMING_FIELDS = [("ttft", "Time to first token"), ("prefill_tps", "Prefill"), ("decode_tps", "Decode")]
IDENTITY_FIELDS = [("identity", "Previous variant"), ("verify", "Cold run")]
STORE_FIELDS = [("entries", "Snapshots in memory"), ("memory", "Memory"), ("disk", "On disk"), ("hits", "Hits / lookups")]
LAYER_COLUMNS = ["#", "Cache class", "Offset", "Size", "Trim"]
ACTIONS = {Action.REGENERATE: "regenerated", Action.VARIANT: "new variant", Action.EDIT: "after an edit", Action.RETRY: "retry"}
NO_REPLY = "No reply selected"
NO_REPORT = "This reply has no cache report yet"
VERIFYING = "running a cold generation…"


def chunks_text(chunks: list[list[int]], message_starts: Sequence[int] = (),
                reply_header_cuts: Sequence[int] = ()) -> str:
    """The prefill forwards; a ✉ marks a chunk that ends where a message starts, a ↩ one that
    ends at a reply header cut (an earlier reply's generation header but its last token: where
    that turn's regenerate point ends, so the cache shares it: engine/cache/planner.py)."""
    if not chunks:
        return "none (whole prompt restored)"
    starts, headers = set(message_starts), set(reply_header_cuts)
    shown = [f"[{a}, {b}){'✉' if b in starts else ''}{'↩' if b in headers else ''}" for a, b in chunks]
    if len(shown) > 8:
        shown = shown[:4] + ["…"] + shown[-3:]
    text = f"{len(chunks)} forward{'s' if len(chunks) != 1 else ''}: " + " ".join(shown)
    if starts:
        text += f"\n✉ message starts: {', '.join(str(m) for m in sorted(starts))}"
    if headers:
        text += f"\n↩ reply header cuts: {', '.join(str(m) for m in sorted(headers))}"
    return text


@dataclass(frozen=True)
class ContextVM:
    """How full the model's context is for a conversation, and what was left out of it."""

    used: int  # tokens of the last prompt sent, plus its reply
    limit: Optional[int]
    dropped: int  # oldest messages not sent

    @property
    def fraction(self) -> float:
        return min(self.used / self.limit, 1.0) if self.limit else 0.0

    @property
    def text(self) -> str:
        return f"{self.used:,} / {self.limit:,} tokens" if self.limit else f"{self.used:,} tokens"

    @property
    def marker(self) -> str:
        n = self.dropped
        return f"{n} earlier message{'s are' if n != 1 else ' is'} not sent to the model (the context is full)"


def context_vm(vms: Sequence[MessageVM]) -> Optional[ContextVM]:
    """From the newest reply on the path that has a report (None: nothing sent yet)."""
    for vm in reversed(vms):
        if vm.report is not None and vm.report.context is not None:
            ctx = vm.report.context
            return ContextVM(ctx.prompt_tokens + vm.tokens, ctx.limit, ctx.dropped_messages)
    return None


def context_marker(vms: Sequence[MessageVM]) -> Optional[tuple[int, str]]:
    """Where (index into vms) and what the "left out" marker says, for the newest reply."""
    ctx = context_vm(vms)
    if ctx is None or not ctx.dropped:
        return None
    lead = next((i for i, vm in enumerate(vms) if vm.role != "system"), len(vms))
    return min(lead + ctx.dropped, len(vms)), ctx.marker


def context_text(report: CacheReport) -> str:
    ctx = report.context
    if ctx is None:
        return "–"
    used = f"{ctx.prompt_tokens:,} of {ctx.limit:,} tokens" if ctx.limit else f"{ctx.prompt_tokens:,} tokens"
    if ctx.dropped_messages:
        used += f" · {ctx.dropped_messages} oldest message{'s' if ctx.dropped_messages != 1 else ''} left out"
    return used


def sampler_text(s: dict[str, Any]) -> str:
    if not s:
        return "–"
    keys = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens")
    short = {"temperature": "T", "repetition_penalty": "rep", "max_tokens": "max"}
    return ", ".join(f"{short.get(k, k)}={s[k]}" for k in keys if k in s)


@dataclass(frozen=True)
class DebugVM:
    """The debug panel's reading of one reply: a title, one text per row, the layer table."""

    title: str
    rows: dict[str, str]  # key of REPORT_FIELDS / TIMING_FIELDS / "identity" -> text
    model_key: str  # in full (the row shows a prefix)
    layers: list[list[str]]  # one row of LAYER_COLUMNS per layer
    declines: str
    ranks: list[str] = field(default_factory=list)  # one line per rank (a run on several ranks)
    documents: list[str] = field(default_factory=list)  # one line per attached document


def debug_vm(vm: MessageVM, run: Optional[Run] = None) -> DebugVM:
    """The debug panel's reading of a reply's run: `run`, else the one it shows (`vm.shown`)."""
    if run is None and vm.shown is not None:
        run = vm.runs[vm.shown]
    r = run.report if run is not None else vm.report
    outcome = run.outcome if run is not None else vm.outcome
    assert r is not None
    n = len(vm.runs)
    k = vm.runs.index(run) + 1 if run is not None and run in vm.runs else n
    how = ACTIONS.get(outcome.action, "")
    if outcome.duplicate_of is not None:
        how = f"{how or 'regenerated'} again: identical, no copy added"
    title = (f"<b>Reply {vm.navigator}</b>" + (f" · run {k} of {n}" if n > 1 else "") + (f" · {how}" if how else ""))
    snaps = ", ".join(f"{s.get('kind')} @{s.get('length')} (canonical {s.get('canonical')})" for s in r.snapshots_stored)
    rows = {
        "prompt_tokens": str(r.prompt_tokens),
        "matched": str(r.matched),
        # One meaning everywhere: of the prompt (and a Continue's reply so far); 0 of a match says why.
        "restored": restored_of(r) + (f" ({why})" if (why := no_restore_reason(r)) else ""),
        "snapshot_length": "none" if r.stored is None else str(r.stored),
        "partial": "yes (cut back)" if r.partial else "no",
        "source": r.source or "none (cold prefill)",
        "mode": str(r.mode),
        "chunk_size": str(r.chunk_size),
        "prefill_tokens": str(r.prefill_tokens),
        "chunks": chunks_text(r.chunks, r.message_starts, r.reply_header_cuts),
        "context": context_text(r),
        "snapshots": snaps or "none",
        "seed": str(r.seed),
        "sampler": sampler_text(r.sampler),
        "model_key": r.model_key[:16] + ("…" if len(r.model_key) > 16 else ""),
        "ttft": format_seconds(r.ttft_s),
        "prefill_tps": prefill_rate_text(r),
        "decode_tps": f"{r.decode_tps or 0:.1f} tok/s",
        "identity": identity_text(outcome, long=True, mode=r.mode),
    }
    layers = [
        [str(x.index), x.cache_class, "–" if x.offset is None else str(x.offset), str(x.size),
         "yes" if x.trimmable else "no"]
        for x in r.layers
    ]  # fmt: skip
    declines = "\n".join(f"• {d}" for d in r.declines) if r.declines else "none"
    ranks = [rank_line(x) for x in r.ranks] if r.world_size > 1 else []
    return DebugVM(title, rows, r.model_key, layers, declines, ranks, [document_line(d) for d in r.documents])


DOCUMENT_SOURCES = {"memory": "restored from memory", "disk": "restored from disk", "prefilled": "prefilled now"}


def document_line(d: dict[str, Any]) -> str:
    """'report.pdf: 6,120 tokens (prompt 41–6,161), restored from disk'."""
    tokens = int(d.get("tokens") or 0)
    where = f"prompt {int(d.get('start') or 0):,}–{int(d.get('end') or 0):,}"
    source = DOCUMENT_SOURCES.get(str(d.get("source")), str(d.get("source") or "?"))
    cut = "" if d.get("cut", True) else "; no cut at its end (the tokenizer merged across it): shared only as a prefix"
    return f"{d.get('name', '?')}: {tokens:,} tokens ({where}), {source}{cut}"


def rank_line(rank: dict[str, Any]) -> str:
    """One rank of a distributed run, what its own prompt cache did: "rank 1 (mac2): restored 41
    from memory · stored 50 · layers all 30 at 41 · no declines"."""
    who = f"rank {rank.get('rank', '?')} ({rank.get('host') or '?'})"
    if rank.get("error"):
        return f"{who}: {rank['error']}"
    offsets = list(rank.get("layer_offsets") or [])
    if offsets and all(o == offsets[0] for o in offsets):
        layers = f"layers all {len(offsets)} at {offsets[0]}"
    else:
        layers = "layers at " + (", ".join("–" if o is None else str(o) for o in offsets) or "–")
    source = f"from {rank['source']}" if rank.get("source") else "(cold prefill)"
    stored = "" if rank.get("stored") is None else f" · stored {rank['stored']}"
    declines = rank.get("declines") or []
    refused = "; ".join(str(d) for d in declines) if declines else "no declines"
    return f"{who}: restored {rank.get('restored', 0)} {source}{stored} · {layers} · {refused}"


def stats_rows(stats: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """The cache store box from Engine.cache_stats(): key -> (text, tooltip)."""
    if "remote" in stats:  # a server's (RemoteEngine.cache_stats): its cache is its own
        ranks = int(stats.get("world_size") or 1)
        where = f"each of {ranks} ranks in its own folder" if ranks > 1 else "the server's"
        return {"entries": ("on the server", ""), "memory": (str(stats["remote"]), ""),
                "disk": (where, ""), "hits": ("–", "")}
    budget = stats.get("memory_budget_bytes")
    rows = {
        "entries": (str(stats.get("memory_entries", "–")), ""),
        "memory": (format_bytes(stats.get("memory_bytes")) + (f" of {format_bytes(budget)}" if budget else "")
                   + (f", {stats['memory_blocks']} blocks, {format_bytes(stats.get('memory_shared_bytes') or 0)} shared"
                      if stats.get("memory_blocks") is not None else ""), ""),
        "hits": (f"{stats.get('hits', 0)} / {stats.get('lookups', 0)}", ""),
    }
    disk = stats.get("disk") or {}
    if not disk:
        rows["disk"] = ("no disk tier", "")
    else:
        entries = disk.get("entries", disk.get("count"))
        nbytes = disk.get("bytes", disk.get("size_bytes"))
        parts = []
        if entries is not None:
            parts.append(f"{entries} snapshot{'s' if entries != 1 else ''}")
        if nbytes is not None:
            parts.append(format_bytes(nbytes))
        if disk.get("blocks") is not None:  # the block store (engine/cache/blocks.py): each block once
            parts.append(f"{disk['blocks']} blocks, {format_bytes(disk.get('shared_bytes') or 0)} shared")
        rows["disk"] = (", ".join(parts) or json.dumps(disk), json.dumps(disk, indent=1, default=str))
    return rows


# ------------------------------------------------------------------------------ compare view
def compare_verdict(cmp: Comparison, modes: tuple[str, str] = ("exact", "exact")) -> str:
    """The compare view's one-line verdict."""
    n = cmp.lengths[0]
    if cmp.identical:
        return f"identical ({n} tokens, bit-equal logprobs)"
    if cmp.first_diff is None:
        note = f" ({FAST_NOTE})" if "fast" in modes else ""
        return f"same tokens, logprobs differ by up to {cmp.max_logprob_diff:.3g}{note}"
    k = cmp.first_diff
    if k == min(cmp.lengths):
        which = "the first" if cmp.lengths[0] < cmp.lengths[1] else "the second"
        same = "bit-equal logprobs" if cmp.max_logprob_diff == 0 else f"logprobs differ by up to {cmp.max_logprob_diff:.3g}"
        return f"diverge at token {k}: {which} ends there, the same tokens before it ({same})"
    return f"diverge at token {k}"


def prefix_text(cmp: Comparison) -> str:
    """'shared prefix: 42 tokens, 198 characters; max |Δ logprob| before it 0'."""
    chars = f", {cmp.shared_chars} characters" if cmp.shared_chars is not None else ""
    return (f"shared prefix: {cmp.shared_tokens} tokens{chars} · lengths {cmp.lengths[0]} / {cmp.lengths[1]} tokens"
            f" · max |Δ logprob| over the shared prefix {cmp.max_logprob_diff:.3g}")


def side_text(side: Any) -> str:
    """A compare side's settings and provenance: 'seed 7 · exact · T=0.9, top_p=0.95 · cache: memory 170 / 171'."""
    cache = f"{side.source} {side.restored} / {side.prompt_tokens}" if side.source else f"none (cold, {side.prompt_tokens} prompt tokens)"
    stopped = " · stopped" if side.status == "interrupted" else ""
    return (f"seed {side.seed if side.seed is not None else '–'} · {side.mode} · {sampler_text(side.sampler)}"
            f" · cache: {cache} · {len(side.tokens)} tokens{stopped}")


def token_tooltip(token: int, text: str, logprob: float) -> str:
    """Hover text of one token in the per-token view."""
    import math

    p = math.exp(logprob) if logprob > -700 else 0.0
    return f"token {token} · {text!r} · logprob {logprob:.6g} (p = {p:.3g})"
