"""The ranks agree on one restore point before any forward.

Each rank keeps its own memory and disk tiers, so one rank may be able to restore less than
the others (its folder deleted, a snapshot file corrupted, a write not yet finished). Tensor
parallelism needs every rank at the same position, and exactness needs every rank on the
same schedule: so each rank plans its own restore, one all-reduce gives the minimum and the
maximum over the ranks, and a rank above the minimum plans again capped at it. Repeated until
all agree (it ends: the point only goes down, and 0, nothing restored, is always possible).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from engine.cache.prompt_cache import PromptCache
from engine.cache.planner import Plan
from engine.distributed.group import Group


class AgreedPromptCache(PromptCache):
    """A rank's prompt cache whose `fetch` returns the restore point every rank agreed on."""

    def __init__(self, group: Group, budget_bytes: int, disk: Any = None, policy: Any = None) -> None:
        super().__init__(budget_bytes, disk) if policy is None else super().__init__(budget_bytes, disk, policy)
        self.group = group

    def fetch(self, model_key: str, prompt: Sequence[int], mode: str, cuts: Sequence[int],
              singles_from: Optional[int] = None) -> tuple[Plan, Optional[list[Any]]]:
        plan, cache = super().fetch(model_key, prompt, mode, cuts, singles_from)
        matched, declines = plan.matched, list(plan.declines)
        while True:
            mine = plan.reuse if cache is not None else 0
            low, high = self.group.min_max(mine, "restore point")
            if low == high:
                break
            if mine > low:
                declines.append(f"rank {self.group.rank}: restore cut from {mine} to {low}, "
                                f"the most every rank can restore")
                if cache is not None:
                    self.hits -= 1  # this lookup is counted once, by what is finally restored
                self.lookups -= 1
                # Planning against prompt[:low + 1] caps the restore at `low` (never the last token).
                plan, cache = super().fetch(model_key, prompt[: low + 1], mode, cuts, singles_from)
        plan.matched, plan.declines = matched, declines + [d for d in plan.declines if d not in declines]
        return plan, cache
