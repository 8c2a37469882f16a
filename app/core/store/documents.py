"""The documents attached to user messages, in the store (schema v6).

A document belongs to the user message it was sent with (an edit of that message keeps it: the
branch asks about the same files). The prompt for a reply carries every document attached on
its path, oldest message first, each message's in attach order: the engine places them all at
the end of the system message (engine/documents/placement.py), so an earlier reply regenerates
with exactly the documents it was answered with, and a later attach never changes what an
earlier turn saw.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from app.core.store.records import StoreError
from engine.documents.extract import Document
from engine.errors import RequestError


class DocumentRows:
    """Mixed into ConversationStore (uses its transactions and message helpers)."""

    def _add_documents(self, message_id: int, documents: Iterable[Document]) -> None:
        """Inside a write transaction: attach `documents` to the message, after any it has."""
        c = self._conn  # type: ignore[attr-defined]
        start = c.execute("SELECT COALESCE(MAX(position) + 1, 0) FROM documents WHERE message_id = ?",
                          (message_id,)).fetchone()[0]  # fmt: skip
        for i, d in enumerate(documents):
            c.execute("INSERT INTO documents (message_id, position, name, digest, kind, pages, text)"
                      " VALUES (?, ?, ?, ?, ?, ?, ?)",
                      (message_id, start + i, d.name, d.digest, d.kind, d.pages, d.text))  # fmt: skip

    def _copy_documents(self, from_id: int, to_id: int) -> None:
        """Inside a write transaction: the documents of `from_id` attached to `to_id` too (an edit)."""
        self._add_documents(to_id, self._documents_of([from_id]).get(from_id, []))

    def _documents_of(self, message_ids: Sequence[int]) -> dict[int, list[Document]]:
        out: dict[int, list[Document]] = {}
        if not message_ids:
            return out
        marks = ", ".join("?" for _ in message_ids)
        rows = self._conn.execute(  # type: ignore[attr-defined]
            f"SELECT message_id, name, digest, kind, pages, text FROM documents"
            f" WHERE message_id IN ({marks}) ORDER BY message_id, position", tuple(message_ids))
        for r in rows:
            out.setdefault(r[0], []).append(Document(r[1], r[5], r[2], r[3], r[4]))
        return out

    def documents(self, message_ids: Sequence[int]) -> dict[int, list[Document]]:
        """Each message's documents in attach order (messages without any are left out)."""
        with self._tx(write=False):  # type: ignore[attr-defined]
            return self._documents_of(list(message_ids))

    def remove_document(self, message_id: int, index: int) -> Document:
        """Take the `index`-th document (attach order) off a user message that has no reply yet
        (one the engine refused to answer: its documents do not fit); a message with replies
        keeps its documents (they made those replies: an edit branches instead). Returns it."""
        with self._tx() as c:  # type: ignore[attr-defined]
            msg = self._get_message(message_id)  # type: ignore[attr-defined]
            if msg.role != "user":
                raise StoreError("only a user message carries documents")
            if c.execute("SELECT 1 FROM messages WHERE parent_id = ? LIMIT 1", (message_id,)).fetchone():
                raise StoreError("this message has replies: its documents made them (edit it to ask without one)")
            docs = self._documents_of([message_id]).get(message_id, [])
            if not 0 <= index < len(docs):
                raise StoreError(f"this message has no document {index + 1}")
            rows = c.execute("SELECT position FROM documents WHERE message_id = ? ORDER BY position",
                             (message_id,)).fetchall()  # fmt: skip
            c.execute("DELETE FROM documents WHERE message_id = ? AND position = ?", (message_id, rows[index][0]))
            return docs[index]

    def document_digests(self) -> set[str]:
        """The digests of every document some message still has (what the cache keeps warm)."""
        with self._tx(write=False) as c:  # type: ignore[attr-defined]
            return {r[0] for r in c.execute("SELECT DISTINCT digest FROM documents")}

    def documents_for_prompt(self, upto_message_id: int) -> tuple[Document, ...]:
        """The documents on the path root .. upto_message_id, in the order the engine places them."""
        with self._tx(write=False):  # type: ignore[attr-defined]
            chain = [m.id for m in self._ancestry(upto_message_id)]  # type: ignore[attr-defined]
            by_message = self._documents_of(chain)
        return tuple(d for mid in chain for d in by_message.get(mid, []))


def exported(documents: Sequence[Document]) -> list[dict[str, Any]]:
    """A message's documents as an export file holds them (the text and the file's digest)."""
    return [d.to_dict() for d in documents]


def imported(value: Any, where: str) -> list[Document]:
    """An export file's `documents` of one message, checked; StoreError says what is wrong."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise StoreError(f"Not a valid Verbatim conversation file: {where} documents must be a list")
    try:
        return [Document.from_dict(d) if isinstance(d, dict) else Document.from_dict({}) for d in value]
    except RequestError as e:
        raise StoreError(f"Not a valid Verbatim conversation file: {where}: {e}") from e
