"""A file's text, for the chat: plain text, Markdown and source code as they are, PDF through
PDFium (pypdfium2: pdf.py), .docx through a streaming reader of Word's XML (word.py).

How a file is recognised (by its media type, then its first bytes, then its name), which reader
takes it, and what is refused: too large, encrypted, broken, binary, or without text, each a
`DocumentError` naming the file (document.py). `document_from_bytes` reads in the calling process
with no bound on time or memory; a file from anyone else (a drop, `--attach`, a server's `file`
part) is read through bounded.py, which gives PDF and Word files a process of their own, killed
at its limits. Why these libraries: docs/documents.md.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Optional

from engine.documents.document import (  # Document: also imported from here
    MAX_FILE_BYTES,
    MAX_TEXT_CHARS,
    Document,
    DocumentError,
    Extracted,
    Tick,
    too_much_text,
)
from engine.documents.pdf import read_pdf
from engine.documents.word import read_docx

BINARY_BLOCK = 65536  # characters: each block of a text file is checked for binary content on its own


def check_size(name: str, size: int) -> None:
    if size > MAX_FILE_BYTES:
        raise DocumentError(name, f"too large ({size / 2**20:.0f} MiB; at most {MAX_FILE_BYTES >> 20} MiB)")
    if size == 0:
        raise DocumentError(name, "the file is empty")


def kind_of(name: str, data: bytes, mime: Optional[str] = None) -> str:
    """How to read a file: "text", "pdf" or "docx". A media type that names one of them decides
    (a server's file part; a remote engine sends a PDF's extracted text as text/plain); else the
    content (a PDF's header, a zip archive's), then the name's suffix; anything else is text (and
    refused there if it is not)."""
    mime = (mime or "").lower()
    if mime == "application/pdf":
        return "pdf"
    if mime.endswith("wordprocessingml.document"):
        return "docx"
    if mime.startswith("text/"):
        return "text"
    if data.startswith(b"%PDF-"):
        return "pdf"
    if data.startswith(b"PK\x03\x04"):  # a zip: word.py says whether it is a Word document
        return "docx"
    if data.startswith(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"):  # OLE2: Word 97-2003, old Excel...
        raise DocumentError(name, "an Office 97-2003 file (.doc, .xls...): save it as .docx, PDF or text first")
    suffix = Path(name).suffix.lower()
    return {".pdf": "pdf", ".docx": "docx"}.get(suffix, "text")


def read_raw(kind: str, name: str, data: bytes, chars: int = MAX_TEXT_CHARS, tick: Tick = lambda: None) -> Extracted:
    """The text of `data` as `kind`, stopping with a DocumentError once it passes `chars`."""
    if kind == "pdf":
        return read_pdf(name, data, chars, tick)
    if kind == "docx":
        return read_docx(name, data, chars, tick)
    return Extracted(read_text(name, data, chars))


def finish(name: str, data: bytes, kind: str, got: Extracted, chars: int = MAX_TEXT_CHARS) -> Document:
    """The document from a reader's text: normalised, and refused if it holds none or too much."""
    text = _normalise(got.text)
    if not text.strip():
        raise DocumentError(name, "has no text to read" + (" (a scanned PDF? run OCR on it first)" if kind == "pdf" else "")
                            + (f"; not read: {', '.join(got.unread)}" if got.unread else ""))
    if len(text) > chars:
        raise too_much_text(name, len(text), chars)
    return Document(name, text, hashlib.sha256(data).hexdigest(), kind, got.pages, got.unread)


def document_from_bytes(name: str, data: bytes, mime: Optional[str] = None) -> Document:
    """The document in `data`, read in this process with no bound on time or memory: for text
    this process made or already holds (tests, the reader process itself). A file from anyone
    else goes through bounded.py."""
    check_size(name, len(data))
    kind = kind_of(name, data, mime)
    return finish(name, data, kind, read_raw(kind, name, data))


_CONTROLS = re.compile("[\x00-\x08\x0b\x0e-\x1f\x7f-\x9f]")  # control characters other than \t \n \r \f


def read_text(name: str, data: bytes, chars: int = MAX_TEXT_CHARS) -> str:
    """UTF-8 text (a BOM dropped), refused if it is binary anywhere in the file: a NUL byte, or
    any block of BINARY_BLOCK characters with more than 1% (at least 8) control characters."""
    if len(data) > 4 * chars + 3:  # UTF-8 takes at most 4 bytes a character: too much for sure
        raise too_much_text(name, len(data) // 4, chars, more=True)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise DocumentError(name, "is not text (not UTF-8), a PDF or a .docx") from None
    if len(text) > chars:
        raise too_much_text(name, len(text), chars)
    if "\x00" in text:
        raise DocumentError(name, f"looks binary, not text (a NUL byte at character {text.index(chr(0)):,})")
    for at in range(0, len(text), BINARY_BLOCK):
        block = text[at:at + BINARY_BLOCK]
        controls = len(_CONTROLS.findall(block))
        if controls > max(8, len(block) // 100):
            raise DocumentError(name, f"looks binary, not text ({controls} control characters from character {at:,})")
    return text


def _normalise(text: str) -> str:
    """One newline convention, no NULs, no trailing spaces on lines: the same file gives the same
    tokens on every platform."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    return "\n".join(line.rstrip() for line in text.split("\n")).strip("\n")
