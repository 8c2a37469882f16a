"""The prompt cache's vocabulary: the kinds of snapshot, and where a restored state came from.

Both are `StrEnum`s: a member is its string value (`==`, hashing, `str()`, f-strings and
`json.dumps` all see the plain string), so the disk index, the report's JSON and the HTTP
`verbatim` object say exactly what they said when these were bare strings, and a value read
back as a plain string (an older index, a stored report) compares equal to its member.
"""

from __future__ import annotations

from enum import StrEnum


class SnapshotKind(StrEnum):
    """When a generation took a snapshot (planner.py's module doc has why each exists)."""

    PRE_LAST = "pre-last"  # after prefill: the prompt but its last token (what a regenerate restores)
    END = "end"  # the prompt and the reply (what the next turn restores)
    BOUNDARY = "boundary"  # during prefill, at the last cut before the end (caches that cannot be cut back)
    PARTIAL = "partial"  # a prefill stopped at an exact cut; or a prefix of one read back from disk
    DOCUMENT = "document"  # a kept state: where an attached document ends (kept while a conversation uses
    # it), or where a long system turn ends (a harness's system prompt and tools: generate/prepare.py)


class RestoreSource(StrEnum):
    """Where a restored state came from (`Plan.source`, `CacheReport.source`)."""

    MEMORY = "memory"
    DISK = "disk"
