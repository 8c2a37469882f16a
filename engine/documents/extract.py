"""A file's text, for the chat: plain text, Markdown and source code as they are, PDF through
PDFium (pypdfium2), .docx through python-docx.

Why these libraries: docs/documents.md (pypdfium2 extracts the same text as pypdf about 15x
faster on the PDFs measured, in a wheel with macOS arm64 builds; python-docx is the maintained
reader of Word's format). Everything is checked before any prefill, and a file that cannot be
read gets a `DocumentError` naming it: too large, encrypted, broken, binary, or without text.
"""

from __future__ import annotations

import hashlib
import io
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from engine.errors import RequestError

MAX_FILE_BYTES = 64 << 20  # a file larger than this is refused before it is read
MAX_TEXT_CHARS = 2_000_000  # ~500k tokens: more than any context this app runs
# Suffixes read as text (anything else that decodes as UTF-8 text is read too).
TEXT_SUFFIXES = frozenset({".txt", ".md", ".markdown", ".rst", ".csv", ".tsv", ".json", ".yaml", ".yml",
                           ".toml", ".ini", ".cfg", ".log", ".xml", ".html", ".htm", ".tex"})


class DocumentError(RequestError):
    """A file that cannot be a document: the message names it and says why."""

    def __init__(self, name: str, why: str, param: Optional[str] = None) -> None:
        super().__init__(f"{name}: {why}", param)
        self.name = name


@dataclass(frozen=True)
class Document:
    """A file's extracted text and what identifies it. `digest` is the SHA-256 of the file's
    bytes (what the conversation stores beside the text); `text_digest` that of the text the
    model reads (what a receipt checks)."""

    name: str
    text: str
    digest: str
    kind: str  # "text" | "pdf" | "docx"
    pages: Optional[int] = None  # PDF pages; None for the others

    @property
    def text_digest(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def to_dict(self) -> dict:
        return {"name": self.name, "digest": self.digest, "kind": self.kind, "pages": self.pages,
                "text": self.text}

    @classmethod
    def from_dict(cls, d: dict) -> "Document":
        for key, typ in (("name", str), ("text", str), ("digest", str), ("kind", str)):
            if not isinstance(d.get(key), typ):
                raise RequestError(f"a document needs a string '{key}'")
        pages = d.get("pages")
        return cls(d["name"], d["text"], d["digest"], d["kind"], pages if isinstance(pages, int) else None)


def read_document(path: str | Path) -> Document:
    """The document in the file at `path` (the name shown is the file's name)."""
    p = Path(path)
    name = p.name
    try:
        if not p.is_file():
            raise DocumentError(name, "not a regular file" if p.exists() else "no such file")
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise DocumentError(name, f"too large ({size / 2**20:.0f} MiB; at most {MAX_FILE_BYTES >> 20} MiB)")
        data = p.read_bytes()
    except OSError as e:
        raise DocumentError(name, f"cannot be read ({e.strerror or e})") from None
    return document_from_bytes(name, data)


def document_from_bytes(name: str, data: bytes, mime: Optional[str] = None) -> Document:
    """The document in `data` (a file's bytes: from disk, a drop, a server's file part)."""
    if len(data) > MAX_FILE_BYTES:
        raise DocumentError(name, f"too large ({len(data) / 2**20:.0f} MiB; at most {MAX_FILE_BYTES >> 20} MiB)")
    if not data:
        raise DocumentError(name, "the file is empty")
    digest = hashlib.sha256(data).hexdigest()
    suffix = Path(name).suffix.lower()
    pages: Optional[int] = None
    kind = _kind(data, suffix, mime)
    if kind == "pdf":
        text, pages = _pdf(name, data)
    elif kind == "docx":
        text = _docx(name, data)
    else:
        text = _text(name, data)
    text = _normalise(text)
    if not text.strip():
        raise DocumentError(name, "has no text to read" + (" (a scanned PDF? run OCR on it first)" if kind == "pdf" else ""))
    if len(text) > MAX_TEXT_CHARS:
        raise DocumentError(name, f"too much text ({len(text):,} characters; at most {MAX_TEXT_CHARS:,})")
    return Document(name, text, digest, kind, pages)


def _kind(data: bytes, suffix: str, mime: Optional[str]) -> str:
    """How to read a file: a media type given with it decides (a server's file part, a remote
    engine's text sent for a PDF), else its first bytes and its name."""
    if mime == "application/pdf":
        return "pdf"
    if (mime or "").endswith("wordprocessingml.document"):
        return "docx"
    if (mime or "").startswith("text/"):
        return "text"
    if data.startswith(b"%PDF") or suffix == ".pdf":
        return "pdf"
    return "docx" if suffix == ".docx" else "text"


def _text(name: str, data: bytes) -> str:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise DocumentError(name, "is not text (not UTF-8), a PDF or a .docx") from None
    # Binary data that happens to decode: control characters other than whitespace.
    controls = sum(1 for c in text[:65536] if unicodedata.category(c) == "Cc" and c not in "\n\r\t\f")
    if controls > max(8, len(text[:65536]) // 100):
        raise DocumentError(name, "looks binary, not text")
    return text


def _pdf(name: str, data: bytes) -> tuple[str, int]:
    import pypdfium2

    try:
        pdf = pypdfium2.PdfDocument(data)
    except pypdfium2.PdfiumError as e:
        why = str(e)
        if "password" in why.lower():
            raise DocumentError(name, "the PDF is encrypted (password-protected); open it and save an unlocked copy") from None
        raise DocumentError(name, f"not a readable PDF ({why})") from None
    try:
        pages = []
        for i in range(len(pdf)):
            page = pdf[i]
            textpage = page.get_textpage()
            pages.append(textpage.get_text_range())
            textpage.close()
            page.close()
        return "\n\n".join(pages), len(pages)
    except pypdfium2.PdfiumError as e:
        raise DocumentError(name, f"a page of the PDF cannot be read ({e})") from None
    finally:
        pdf.close()


def _docx(name: str, data: bytes) -> str:
    import docx
    from docx.opc.exceptions import PackageNotFoundError

    try:
        doc = docx.Document(io.BytesIO(data))
    except (PackageNotFoundError, KeyError, ValueError, OSError) as e:
        raise DocumentError(name, f"not a readable .docx ({e})") from None
    except Exception as e:  # zipfile.BadZipFile, lxml errors: a broken file, said as such
        raise DocumentError(name, f"not a readable .docx ({type(e).__name__}: {e})") from None
    parts = [p.text for p in doc.paragraphs]
    for table in doc.tables:
        for row in table.rows:
            parts.append(" | ".join(cell.text for cell in row.cells))
    return "\n".join(parts)


def _normalise(text: str) -> str:
    """One newline convention, no NULs, no trailing spaces on lines: the same file gives the same
    tokens on every platform."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    return "\n".join(line.rstrip() for line in text.split("\n")).strip("\n")
