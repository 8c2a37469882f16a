"""The run in progress, as far as it got (no Qt): what the debug panel shows of a reply while it
is made, until the final report replaces it.

The engine yields a `RestoreEvent` right after the prompt cache's restore (the report so far:
what was restored and from where, every layer's offset, the plan's declines, the forwards
planned), then a `PrefillProgress` after every prefill chunk, then the reply's tokens; a window
attached to a server gets the same from its stream (engine/remote.py). `LiveRun.advanced` folds a
batch of them; `report` is the report as far as the run got (`RestoreEvent.report_at`);
`live_debug_vm` words it for the debug panel.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable, Literal, Optional

from app.core.store import Action
from app.core.conversation.view_models import ACTIONS, DebugVM, MessageVM, chunks_text, debug_vm
from engine.types import CacheReport, PrefillProgress, RestoreEvent, TokenEvent

Phase = Literal["restoring", "prefilling", "decoding"]


@dataclass(frozen=True)
class LiveRun:
    """One reply's run in progress: the restore (None until the engine has done it), the prompt
    tokens the cache holds so far of how many, and whether decode began (with its tokens)."""

    reply_id: int
    action: Action = Action.SEND  # why the reply is made (a regenerate, a new variant, ...)
    restore: Optional[RestoreEvent] = None
    done: int = 0  # prompt tokens in the cache (restored + prefilled)
    total: int = 0  # prompt tokens in all (0: not known yet)
    decoding: bool = False  # the prefill is over and decode began (its first token came)

    @property
    def phase(self) -> Phase:
        if self.restore is None:
            return "restoring"
        return "decoding" if self.decoding else "prefilling"

    @property
    def report(self) -> Optional[CacheReport]:
        """The report as far as the run got: the forwards made so far (all the planned ones once
        decode began); None before the restore."""
        if self.restore is None:
            return None
        return self.restore.report_at(self.done, self.decoding)

    @property
    def planned_tokens(self) -> int:
        """Tokens the prefill forwards in all (the last prompt token's included)."""
        return self.restore.planned_tokens if self.restore is not None else 0

    def advanced(self, events: Iterable[Any]) -> "LiveRun":
        """This run after a batch of the engine's events (others, e.g. the Done, are ignored)."""
        run = self
        for event in events:
            if isinstance(event, RestoreEvent):
                report = event.report
                run = replace(run, restore=event, done=report.restored, total=report.prompt_tokens)
            elif isinstance(event, PrefillProgress):
                run = replace(run, done=event.done, total=event.total)
            elif isinstance(event, TokenEvent) and not run.decoding:
                run = replace(run, decoding=True, done=run.total)
        return run


IN_PROGRESS = "–"  # a row only the final report fills (timings, snapshots stored, the comparison)
PHASES = {"restoring": "restoring the prompt cache…", "decoding": "prefill done, decoding…"}


def live_title(vm: MessageVM, run: LiveRun) -> str:
    """'<b>Reply 2 / 2</b> · regenerated · in progress: prefilling 480 / 1,091 tokens'."""
    how = ACTIONS.get(run.action, "")
    phase = PHASES.get(run.phase) or f"prefilling {run.done:,} / {run.total:,} tokens"
    return f"<b>Reply {vm.navigator}</b>" + (f" · {how}" if how else "") + f" · in progress: {phase}"


def live_debug_vm(vm: MessageVM, run: LiveRun) -> Optional[DebugVM]:
    """The debug panel's reading of a reply's run in progress: what was restored and from where,
    the plan's declines, the forwards made of those planned; None before the restore."""
    report = run.report
    if report is None or run.restore is None:
        return None
    d = debug_vm(replace(vm, report=report, runs=(), shown=None))
    planned = run.restore.planned
    rows = dict(d.rows)
    rows["prefill_tokens"] = f"{report.prefill_tokens:,} of {run.planned_tokens:,} planned"
    rows["chunks"] = (f"{len(report.chunks)} of {len(planned)} made · planned "
                      + chunks_text(planned, report.message_starts, report.reply_header_cuts))
    for key in ("snapshots", "ttft", "prefill_tps", "decode_tps", "identity"):
        rows[key] = IN_PROGRESS
    return replace(d, title=live_title(vm, run), rows=rows)
