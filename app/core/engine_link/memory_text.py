"""What the window says of the process's memory (no Qt): the prompt cache's memory tier against
its budget, and the process's memory split (engine/memory.py, `MemoryReport`); attached to a
server, that the memory is the server's. Settings and the debug panel show these words."""

from __future__ import annotations

from typing import Optional

from engine.memory import MIB, MemoryReport


def memory_now_text(memory: Optional[MemoryReport], remote: bool = False) -> str:
    """What the prompt cache's memory tier holds now, of its budget."""
    if remote:
        return "Attached to a server: the prompt cache and its memory are the server's."
    if memory is None:
        return "Not read yet (after the model loads)."
    return (f"Holds {memory.tier / MIB:,.0f} MB now of {memory.tier_budget / MIB:,.0f} MB "
            f"({memory.tier_entries} snapshot{'s' if memory.tier_entries != 1 else ''}).")


def memory_split_text(memory: Optional[MemoryReport], remote: bool = False) -> str:
    """The process's memory, one part a line (engine/memory.py: MemoryReport.lines)."""
    if remote:
        return "The memory that matters is the server's, in its own process."
    return "\n".join(memory.lines()) if memory is not None else "–"
