"""Safe file names from conversation titles: what the export and receipt dialogs suggest."""

from __future__ import annotations

import re
import unicodedata

# Characters no common file system (or shell-free user) wants in a name: path separators, the
# Windows reserved set, control characters; and the ellipsis a long title is cut with (a file name
# is no place to say the title goes on).
_UNSAFE = re.compile(r'[\\/:*?"<>|\x00-\x1f\x7f…]')
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


def receipt_filename(title: str, reply: int, variant: int, variants: int) -> str:
    """A receipt's suggested name: the conversation's title, which reply on the path (1: the first)
    and which of its variants is shown ('Why is the sky blue - reply 1, variant 2 of 3.receipt.json';
    no variant when there is only one)."""
    which = f"reply {reply}" + (f", variant {variant} of {variants}" if variants > 1 else "")
    head = safe_filename(title, "")[: MAX_STEM - len(which) - 3].rstrip(" .")  # the title gives way, not the reply
    return f"{head} - {which}.receipt.json"
