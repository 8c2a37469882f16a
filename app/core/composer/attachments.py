"""The files attached to the message being written (no Qt): read off the GUI thread, each
counted in the loaded model's tokens, removable until Send saves them with the message.

`Attachments` belongs to the composer (app/core/composer/model.py): the chips bind to `changed`
and `refused` and send intents (`add`, `remove`); the composer reads `documents` when it counts
the next prompt and when it sends. Reading a PDF can take a while (pypdfium2, ~1 s for a few
hundred pages), so it runs on a worker thread, and PDF and Word files in a process of their own,
killed past its limits (engine/documents/bounded.py); counting needs the model's tokenizer, so it
runs on the engine thread (`count`, given by the composer).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Awaitable, Callable, Coroutine, Optional, Sequence

from psygnal import Signal

from app.core.jobs import on_daemon_thread
from engine.documents.bounded import read_file
from engine.documents.document import Document, DocumentError, shown_name


@dataclass(frozen=True)
class Attachment:
    """One attached file: its document, and what it adds to the prompt (None until counted)."""

    document: Document
    tokens: Optional[int] = None

    @property
    def chip(self) -> str:
        """'report.pdf · 12 pages · 6,120 tokens' ('· not read: 2 equations' after it when the
        file holds what its reader does not read)."""
        return chip_text(self.document, self.tokens)

    @property
    def tooltip(self) -> str:
        d = self.document
        return (f"{shown_name(d.name)}: {len(d.text):,} characters of {d.kind} text, read once and kept with"
                f" the message (sha256 {d.digest[:16]}…). Documents go after the system prompt, so every"
                " conversation about this file shares its prompt cache." + counted_note(self.tokens) + unread_note(d))


def chip_text(d: Document, tokens: Optional[int] = None) -> str:
    parts = [shown_name(d.name)]
    if d.pages:
        parts.append(f"{d.pages} page" + ("s" if d.pages != 1 else ""))
    if tokens is not None:
        parts.append(f"{tokens:,} tokens")
    if d.unread:
        parts.append("not read: " + ", ".join(d.unread))
    return " · ".join(parts)


def counted_note(tokens: Optional[int]) -> str:
    """A chip's tooltip sentence on what its count includes ('' until counted): the engine's own
    count (Engine.document_tokens), the one its report and a refusal give for the file."""
    if tokens is None:
        return ""
    return (f" {tokens:,} tokens: its part of the system message in this conversation (its name, its text and"
            " the separator before it), as the debug panel's report and a refusal count it.")


def unread_note(d: Document) -> str:
    """A tooltip's sentence on what the file holds that the model does not read ('' if nothing)."""
    return f" Not read (the model does not see them): {', '.join(d.unread)}." if d.unread else ""


def read_files(paths: Sequence[str]) -> tuple[list[Document], list[str]]:
    """Each file's document, and each refusal as 'name: why' (a worker thread's job). PDF and
    Word files are read in a process of their own within limits (engine/documents/bounded.py):
    a hostile file is refused, never a stuck thread or gigabytes in the window's process."""
    docs: list[Document] = []
    refused: list[str] = []
    for p in paths:
        try:
            docs.append(read_file(p))
        except DocumentError as e:
            refused.append(str(e))
        except Exception as e:  # a reader's own failure on a hostile file: still named, nothing lost
            refused.append(f"{shown_name(Path(p).name)}: cannot be read ({type(e).__name__}: {e})")
    return docs, refused


class Attachments:
    """The composer's attached files, in attach order."""

    changed = Signal(list)  # list[Attachment]: the chips to show
    refused = Signal(list)  # list[str]: files that could not be attached, each "name: why"
    reading_changed = Signal(tuple)  # tuple[str, ...]: the names of the files being read now

    def __init__(self, loop: asyncio.AbstractEventLoop, count: Callable[[Document], Awaitable[Optional[int]]],
                 on_change: Callable[[], None] = lambda: None) -> None:  # fmt: skip
        self.loop = loop  # the GUI's (named: pytest-qt runs it without asyncio's running loop set)
        self._count = count  # the tokens a document adds (engine thread), None when no model answers
        self._on_change = on_change  # the composer counts the next prompt again
        self.items: list[Attachment] = []
        self.reading: tuple[str, ...] = ()  # files being read now (Send waits for them)
        self._reads: set["asyncio.Future[Any]"] = set()

    @property
    def documents(self) -> tuple[Document, ...]:
        return tuple(a.document for a in self.items)

    def add(self, paths: Sequence[str], already: Sequence[Document] = ()) -> Coroutine[Any, Any, list[Document]]:
        """Read `paths` (off the GUI thread) and attach what can be read; a file attached already
        (here, or earlier in the conversation: `already`) is not attached twice. The coroutine
        returns the documents added; refusals are told (`refused`), naming each file. From this
        call on, until they are attached, `reading` names the files (a Send waits: `read`)."""
        names = tuple(shown_name(Path(p).name) for p in paths)
        attached = self.loop.create_future()  # done once what was read is attached (or refused)
        self._reads.add(attached)
        self._set_reading(self.reading + names)
        return self._add(list(paths), already, names, attached)

    async def _add(self, paths: list[str], already: Sequence[Document], names: tuple[str, ...],
                   attached: "asyncio.Future[None]") -> list[Document]:  # fmt: skip
        added: list[Document] = []
        refused: list[str] = []
        try:
            docs, refused = await self._read(paths)
            have = {d.digest for d in already} | {a.document.digest for a in self.items}
            for d in docs:
                if d.digest in have:
                    refused.append(f"{d.name}: already attached to this conversation")
                    continue
                have.add(d.digest)
                added.append(d)
            self.items += [Attachment(d) for d in added]
        finally:
            self._reads.discard(attached)
            attached.set_result(None)
            left = list(self.reading)
            for name in names:
                left.remove(name)
            self.reading = tuple(left)
            self.reading_changed.emit(self.reading)
        if refused:
            self.refused.emit(refused)
        self._told()
        for d in added:
            await self._count_one(d)
        return added

    def _set_reading(self, names: tuple[str, ...]) -> None:
        self.reading = names
        self.reading_changed.emit(names)
        self._on_change()  # what Send waits for changed

    async def read(self) -> None:
        """Once every file being read now is read and attached (or refused)."""
        while self._reads:
            await next(iter(self._reads))  # (no asyncio.wait: pytest-qt runs the loop without setting it running)

    def _read(self, paths: list[str]) -> "asyncio.Future[tuple[list[Document], list[str]]]":
        """`read_files` on a daemon thread of its own (a stuck read must not hold up quitting)."""
        return on_daemon_thread(self.loop, read_files, paths, name="verbatim-read")

    async def _count_one(self, document: Document) -> None:
        tokens = await self._count(document)
        for i, a in enumerate(self.items):
            if a.document is document:
                self.items[i] = replace(a, tokens=tokens)
                self.changed.emit(list(self.items))

    async def recount(self) -> None:
        """Count every chip again (another model: another tokenizer)."""
        for a in list(self.items):
            await self._count_one(a.document)

    def remove(self, index: int) -> None:
        if 0 <= index < len(self.items):
            del self.items[index]
            self._told()

    def set(self, documents: Sequence[Document]) -> None:
        """Put documents back (a send the engine refused returns them with the text)."""
        self.items = [Attachment(d) for d in documents]
        self._told()

    def clear(self) -> None:
        if self.items:
            self.items = []
            self._told()

    def _told(self) -> None:
        self.changed.emit(list(self.items))
        self._on_change()
