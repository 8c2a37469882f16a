"""Observation points in the disk writer, for tests that stop or kill it at a precise moment.

Production code calls `hooks.point(name)` at each step of a write; the default `WriterHooks`
does nothing. Tests (and tests/disk_fault_child.py) pass their own object to `DiskCache(hooks=)`
to record, pause or block the writer there.

Points of one snapshot write, in order: begin, temp_partial (the header is in the temp file, the
data not yet), temp_synced, index_tmp, index_written, renamed, done. `index_tmp` also comes with
every other index write. And while a generation holds writes (`hold_writes`): held (a write
is queued and waits to start), paused (a write in progress waits between arrays).
"""

from __future__ import annotations


class WriterHooks:
    """No-op hooks: subclass and override `point`. `partial_file` says whether the writer should
    flush the temp file before `temp_partial`, so that an observer sees a partial file on disk."""

    partial_file = False

    def point(self, name: str) -> None:
        pass


NO_HOOKS = WriterHooks()
