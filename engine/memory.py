"""The process's memory, bounded and told: the memory tier's default budget, MLX's buffer cache
limit, and `MemoryReport` (what `Engine.memory_report` answers: each part and the whole).

What holds memory in an engine process: the model's weights; the live KV cache of a generation
(between generations, the last reply's, kept for a regenerate: PromptCache.keep_spare); the
prompt cache's memory tier (snapshots under a byte budget, settable at run time:
Engine.set_memory_budget); MLX's buffer cache (freed buffers MLX keeps for reuse, under the
limit set here); and the rest of the process (Python, Qt, the tokenizer). The first four are
MLX arrays: `mlx_active` counts the first three, `mlx_cache` the fourth; RSS counts everything
resident.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

MIB = 1 << 20
GIB = 1 << 30

# The memory tier's default budget: a sixteenth of the machine's memory, at least 256 MiB and at
# most 4 GiB (1 GiB on a 16 GB Mac, 512 MiB on 8 GB). What it buys is measured in
# docs/benchmarks.md ("Memory"); the disk tier keeps what memory drops.
BUDGET_FRACTION = 1 / 16
BUDGET_MIN = 256 * MIB
BUDGET_MAX = 4 * GIB

# MLX keeps freed buffers for reuse up to this many bytes (mx.set_cache_limit). MLX's own default
# is its memory limit on Metal (most of the machine's memory: the cache grows with every new
# buffer size a long chat asks for and is never given back) and 32 MiB on the CPU backend.
# Measured on the CPU backend (docs/benchmarks.md, "MLX's buffer cache"): 32 MiB is as fast as
# 128 and 512 MiB, which cost their size in RSS; 0 is slower (CPU time 1.19x a follow-up).
MLX_CACHE_LIMIT = 32 * MIB
_cache_limit: int | None = None  # what limit_mlx_cache set last (MLX cannot be asked)


def physical_memory() -> int:
    """The machine's memory in bytes (0: unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def default_memory_budget(physical: int | None = None) -> int:
    """The memory tier's budget for a machine with `physical` bytes of memory (None: this one)."""
    ram = physical_memory() if physical is None else physical
    if ram <= 0:
        return 2 * GIB  # unknown: what it always was
    return int(min(max(ram * BUDGET_FRACTION, BUDGET_MIN), BUDGET_MAX))


def limit_mlx_cache(limit: int = MLX_CACHE_LIMIT) -> int:
    """Bound MLX's buffer cache to `limit` bytes (process-wide); the limit it had."""
    import mlx.core as mx

    global _cache_limit
    _cache_limit = limit
    return int(mx.set_cache_limit(limit))


def current_mlx_cache_limit() -> int | None:
    """The buffer cache limit this process set (None: MLX's own default is in force)."""
    return _cache_limit


def process_rss() -> int:
    """This process's resident memory in bytes (0: unknown)."""
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:  # psutil.Error, or /proc unreadable in a sandbox
        return 0


@dataclass(frozen=True)
class MemoryReport:
    """Where an engine process's memory is, in bytes (Engine.memory_report)."""

    weights: int  # the loaded model's parameters
    live_kv: int  # the live KV cache kept for a regenerate (the last reply's), between generations
    tier: int  # the prompt cache's memory tier holds
    tier_budget: int  # ...under this budget (Engine.set_memory_budget)
    tier_entries: int  # snapshots in it
    mlx_active: int  # every MLX array alive: the weights, the KV caches, the tier, and the rest
    mlx_cache: int  # freed buffers MLX keeps for reuse
    mlx_cache_limit: int | None  # ...at most (None: MLX's own default)
    mlx_peak: int  # the most MLX ever held at once in this process
    rss: int  # the process's resident memory, everything included (0: unknown)

    @property
    def other_mlx(self) -> int:
        """MLX arrays that are none of the parts above (a generation's temporaries, a grammar)."""
        return max(self.mlx_active - self.weights - self.live_kv - self.tier, 0)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "other_mlx": self.other_mlx}

    def lines(self) -> list[str]:
        """One line per part, as a settings page or a debug panel would show them."""
        mb = lambda n: f"{n / MIB:,.0f} MB"  # noqa: E731
        return [f"Model weights: {mb(self.weights)}",
                f"Live KV cache: {mb(self.live_kv)}",
                f"Prompt cache in memory: {mb(self.tier)} of {mb(self.tier_budget)} ({self.tier_entries} snapshots)",
                f"MLX buffer cache: {mb(self.mlx_cache)}"
                + (f" (at most {mb(self.mlx_cache_limit)})" if self.mlx_cache_limit is not None else ""),
                f"Other MLX arrays: {mb(self.other_mlx)}",
                f"Process (RSS): {mb(self.rss)}" if self.rss else "Process (RSS): unknown"]
