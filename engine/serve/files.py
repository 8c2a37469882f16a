"""OpenAI's chat `file` content parts, read as documents (engine/documents).

    {"type": "file", "file": {"filename": "paper.pdf", "file_data": "data:application/pdf;base64,..."}}

The file's text goes where the engine places every document (the end of the system message, a
cut at its end), wherever the part was in the conversation, so a client that sends the same file
in a new conversation restores its state instead of prefilling it again. A file sent again in a
later turn (clients resend the whole history) is the same document: one copy, the first place.
Everything is read and checked before the request is queued: a bad file is a 400 naming it.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from engine.documents.extract import Document, DocumentError, document_from_bytes
from engine.errors import RequestError

_DATA_URL = re.compile(r"data:(?P<mime>[\w.+/-]*)(?:;[\w=.+-]+)*;base64,", re.ASCII)
FILE_KEYS = frozenset({"filename", "file_data", "file_id"})


def file_part(part: dict[str, Any], where: str) -> Document:
    """The document a `file` part carries; RequestError (param `where`) when it cannot be one."""
    f = part.get("file")
    if not isinstance(f, dict):
        raise RequestError(f"{where}.file must be an object with 'filename' and 'file_data'", f"{where}.file")
    unknown = sorted(set(f) - FILE_KEYS)
    if unknown:
        raise RequestError(f"{where}.file.{unknown[0]} is not supported", f"{where}.file")
    if "file_id" in f:
        raise RequestError(f"{where}.file.file_id: this server has no Files API; send the file itself in "
                           "'file_data' (a base64 data: URL)", f"{where}.file.file_id")
    name = f.get("filename")
    if not isinstance(name, str) or not name.strip() or len(name) > 255:
        raise RequestError(f"{where}.file.filename must name the file (at most 255 characters)",
                           f"{where}.file.filename")
    data = f.get("file_data")
    if not isinstance(data, str):
        raise RequestError(f"{name}: {where}.file.file_data must be a base64 data: URL", f"{where}.file.file_data")
    m = _DATA_URL.match(data)
    if m is None:
        raise RequestError(f"{name}: {where}.file.file_data must be a data: URL "
                           "('data:<type>;base64,<the file's bytes>')", f"{where}.file.file_data")
    try:
        raw = base64.b64decode(data[m.end():], validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(f"{name}: {where}.file.file_data is not valid base64", f"{where}.file.file_data") from None
    try:
        return document_from_bytes(name, raw, m.group("mime") or None)
    except DocumentError as e:
        raise RequestError(str(e), f"{where}.file") from None


def collect(documents: list[Document], doc: Document) -> None:
    """Add `doc` unless a document with the same bytes (digest) is already there."""
    if all(d.digest != doc.digest for d in documents):
        documents.append(doc)
