"""What a document is: a file's text and what identifies it (`Document`), what a reader gives
(`Extracted`), the refusal naming a file (`DocumentError`), the limits every reader shares, and
a file's name as it may be shown (`shown_name`). The readers: extract.py (which reader, text),
pdf.py, word.py; within limits: bounded.py."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Callable, Optional

from engine.errors import RequestError

MAX_FILE_BYTES = 64 << 20  # a file larger than this is refused before it is read
MAX_TEXT_CHARS = 2_000_000  # ~500k tokens: more than any context this app runs
# Documents one request may carry: the server refuses more (a 400 naming the message), the
# engine refuses more before any prefill, and the disk cache reads no snapshot naming more.
MAX_DOCUMENTS = 256

Tick = Callable[[], None]  # called as a reader makes progress (a page, a stretch of XML): bounded.py times it


class DocumentError(RequestError):
    """A file that cannot be a document: the message names it (escaped: shown_name) and says why."""

    def __init__(self, name: str, why: str, param: Optional[str] = None) -> None:
        super().__init__(f"{shown_name(name)}: {why}", param)
        self.name = name
        self.why = why


# Characters a file name may not show raw: controls (a terminal's escape sequences), line and
# paragraph separators, and the bidirectional overrides and isolates (U+202E shows
# "cod.exe" as "exe.doc"). Shown as Python writes them: \x1b, \u202e.
_HIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def shown_name(name: str) -> str:
    """A file name as it may be shown and rendered (a chip, an error line, the prompt's block):
    every control and bidirectional-formatting character escaped. Applying it twice changes
    nothing more."""
    return _HIDDEN.sub(lambda m: ascii(m.group())[1:-1], name)


@dataclass(frozen=True)
class Document:
    """A file's extracted text and what identifies it. `digest` is the SHA-256 of the file's
    bytes (what the conversation stores beside the text); `text_digest` that of the text the
    model reads (what a receipt checks). `unread` names what the file holds that is not in the
    text ("2 equations", "1 comment"): shown in the chip and reported, never dropped silently."""

    name: str
    text: str
    digest: str
    kind: str  # "text" | "pdf" | "docx"
    pages: Optional[int] = None  # PDF pages; None for the others
    unread: tuple[str, ...] = ()

    @property
    def text_digest(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def to_dict(self) -> dict:
        out = {"name": self.name, "digest": self.digest, "kind": self.kind, "pages": self.pages, "text": self.text}
        if self.unread:
            out["unread"] = list(self.unread)
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "Document":
        for key, typ in (("name", str), ("text", str), ("digest", str), ("kind", str)):
            if not isinstance(d.get(key), typ):
                raise RequestError(f"a document needs a string '{key}'")
        pages = d.get("pages")
        unread = d.get("unread", [])
        if not isinstance(unread, list) or not all(isinstance(u, str) for u in unread):
            raise RequestError("a document's 'unread' must be a list of strings")
        return cls(d["name"], d["text"], d["digest"], d["kind"], pages if isinstance(pages, int) else None,
                   tuple(unread))


@dataclass(frozen=True)
class Extracted:
    """What a reader gives: the raw text (not yet normalised), PDF pages, what it did not read."""

    text: str
    pages: Optional[int] = None
    unread: tuple[str, ...] = ()


def named(counts: dict[str, int], plurals: Optional[dict[str, str]] = None) -> tuple[str, ...]:
    """{"comment": 2, "form field": 1} -> ("2 comments", "1 form field"), in a fixed order (what
    a reader did not read: `Document.unread`)."""
    plurals = plurals or {}
    return tuple(f"{n:,} {what if n == 1 else plurals.get(what, what + 's')}"
                 for what, n in sorted(counts.items()) if n)


def too_much_text(name: str, n: int, chars: int = MAX_TEXT_CHARS, more: bool = False) -> DocumentError:
    return DocumentError(name, f"too much text ({'more than ' if more else ''}{n:,} characters; at most {chars:,})")
