"""The one-time move of the GUI's prompt cache out of its data folder.

The GUI used to keep its prompt cache in `<data dir>/cache`: on a Mac that is under Application
Support, backed up by Time Machine, and not where the README (and `python -m engine`) keep it,
`platformdirs.user_cache_dir("Verbatim")/prompt-cache`. The window, holding the data folder's
lock (so no other Verbatim window uses the old folder), moves it once.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

log = logging.getLogger(__name__)


def move_prompt_cache(old: Path, new: Path) -> str:
    """Move `old` to `new` if `old` exists and `new` does not (or is empty); returns what it did:
    "moved", "none" (nothing to move), "kept" (both exist: the old one is left, and logged), or
    "failed: ..." (the old folder stays, the new one is used)."""
    if not old.is_dir():
        return "none"
    if new.exists() and (not new.is_dir() or any(new.iterdir())):
        log.warning("an old prompt cache is left at %s (the cache is now %s): delete it to free the space", old, new)
        return "kept"
    try:
        new.parent.mkdir(parents=True, exist_ok=True)
        if new.is_dir():
            new.rmdir()
        shutil.move(str(old), str(new))  # a rename on one file system, else copy then delete
    except OSError as e:
        log.warning("cannot move the prompt cache from %s to %s: %s", old, new, e)
        return f"failed: {e}"
    log.info("moved the prompt cache from %s to %s", old, new)
    return "moved"
