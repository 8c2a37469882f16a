"""Safe file names from conversation titles: what the export dialog suggests."""

from __future__ import annotations

import re
import unicodedata

# Characters no common file system (or shell-free user) wants in a name: path separators, the
# Windows reserved set, control characters.
_UNSAFE = re.compile(r'[\\/:*?"<>|\x00-\x1f\x7f]')
_RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)), *(f"LPT{i}" for i in range(1, 10))}
MAX_STEM = 80  # characters: leaves room for a folder path and the extension


def safe_filename(title: str, ext: str = ".md", fallback: str = "conversation") -> str:
    """'Why is the sky blue?' -> 'Why is the sky blue.md': unsafe characters dropped, spaces
    collapsed, no leading or trailing dots or spaces, never empty ('..md') nor a reserved
    Windows name, at most MAX_STEM characters before `ext`."""
    stem = unicodedata.normalize("NFC", title)
    stem = _UNSAFE.sub(" ", stem)
    stem = re.sub(r"\s+", " ", stem).strip(" .")
    if len(stem) > MAX_STEM:
        stem = stem[:MAX_STEM].rstrip(" .")
    if not stem or stem.split(".")[0].upper() in _RESERVED:
        stem = f"{fallback} {stem}".strip() if stem else fallback
    return stem + ext
