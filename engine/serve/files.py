"""OpenAI's chat `file` content parts, read as documents (engine/documents).

    {"type": "file", "file": {"filename": "paper.pdf", "file_data": "data:application/pdf;base64,..."}}

The file's text goes where the engine places every document (the end of the system message, a
cut at its end), wherever the part was in the conversation, so a client that sends the same file
in a new conversation restores its state instead of prefilling it again. A file sent again in a
later turn (clients resend the whole history) is the same document: one copy, the first place.

Two steps, so that no file is read on the event loop: `file_part` checks a part's fields and
decodes its bytes while the request is validated (the wire format's parser, no I/O), `collect`
keeps one copy of each file and refuses a request with more than MAX_DOCUMENTS; then `read_all`
(awaited on the path every wire format shares, app._generate) reads them off the loop, each
within the server's limits (engine/documents/bounded.py), and a bad file is a 400 naming its
part. `read_file` is that step for one file, for any endpoint whose parts carry files: bytes, a name and a media type in, a Document or a
RequestError naming the field out. A file read once is kept (READ_CACHE), so a conversation
that resends it every turn does not read it again.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from engine.documents.bounded import SERVER, Limits, read_bytes_async
from engine.documents.document import MAX_DOCUMENTS, Document, DocumentError
from engine.errors import RequestError

_DATA_URL = re.compile(r"data:(?P<mime>[\w.+/-]*)(?:;[\w=.+-]+)*;base64,", re.ASCII)
FILE_KEYS = frozenset({"filename", "file_data", "file_id"})
LIMITS = SERVER  # what reading one client's file may take (engine/documents/bounded.py)
READ_CACHE_CHARS = 8_000_000  # characters of text kept from files read (the least recently used go first)


@dataclass(frozen=True)
class FileBytes:
    """A file a request carries, decoded but not yet read; `where` is its part's field."""

    name: str
    data: bytes
    mime: Optional[str]
    where: str
    digest: str = ""

    def __post_init__(self) -> None:
        if not self.digest:
            object.__setattr__(self, "digest", hashlib.sha256(self.data).hexdigest())


def file_part(part: dict[str, Any], where: str) -> FileBytes:
    """The file a `file` part carries; RequestError (param `where`...) when it cannot be one."""
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
        raise DocumentError(name, f"{where}.file.file_data must be a base64 data: URL", f"{where}.file.file_data")
    m = _DATA_URL.match(data)
    if m is None:
        raise DocumentError(name, f"{where}.file.file_data must be a data: URL "
                                  "('data:<type>;base64,<the file's bytes>')", f"{where}.file.file_data")
    try:
        raw = base64.b64decode(data[m.end():], validate=True)
    except (binascii.Error, ValueError):
        raise DocumentError(name, f"{where}.file.file_data is not valid base64", f"{where}.file.file_data") from None
    return FileBytes(name, raw, m.group("mime") or None, where)


def collect(files: list[FileBytes], f: FileBytes, message: str) -> None:
    """Add `f` unless a file with the same bytes is already there; more than MAX_DOCUMENTS
    different files is a RequestError naming `message` (the disk cache keeps no more)."""
    if any(g.digest == f.digest for g in files):
        return
    if len(files) >= MAX_DOCUMENTS:
        raise RequestError(f"{message}: more than {MAX_DOCUMENTS} documents in one request (at most "
                           f"{MAX_DOCUMENTS} different files)", message)
    files.append(f)


async def read_file(data: bytes, name: str, mime: Optional[str], where: str,
                    limits: Optional[Limits] = None) -> Document:
    """The document in one file a request carries, read off the event loop within `limits`
    (LIMITS by default); a file that cannot be one is a RequestError naming it and its field
    (`where`)."""
    key = (hashlib.sha256(data).hexdigest(), name, mime)
    kept = _kept.get(key)
    if kept is not None:
        return kept
    try:
        doc = await read_bytes_async(name, data, mime, limits or LIMITS)
    except DocumentError as e:
        raise RequestError(str(e), where) from None
    _kept.put(key, doc)
    return doc


async def read_all(files: Sequence[FileBytes]) -> tuple[Document, ...]:
    """The documents in a request's files (`collect`ed while it was validated), read one after
    another off the event loop, in the order first sent."""
    return tuple([await read_file(f.data, f.name, f.mime, f"{f.where}.file") for f in files])


class _ReadCache:
    """Documents read lately, by (file digest, name, media type), least recently used out first."""

    def __init__(self, chars: int) -> None:
        self.chars = chars
        self.items: "OrderedDict[tuple, Document]" = OrderedDict()
        self.held = 0  # characters of the documents kept
        self.lock = threading.Lock()

    def get(self, key: tuple) -> Optional[Document]:
        with self.lock:
            doc = self.items.get(key)
            if doc is not None:
                self.items.move_to_end(key)
            return doc

    def put(self, key: tuple, doc: Document) -> None:
        with self.lock:
            if key not in self.items:
                self.items[key] = doc
                self.held += len(doc.text)
            while self.held > self.chars and len(self.items) > 1:
                self.held -= len(self.items.popitem(last=False)[1].text)


_kept = _ReadCache(READ_CACHE_CHARS)
