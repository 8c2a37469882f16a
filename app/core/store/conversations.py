"""The conversation store: every conversation and every variant of every reply, in SQLite.

Layout: one SQLite file (WAL, synchronous=FULL) under `platformdirs.user_data_dir("Verbatim")`.
Messages form a tree per conversation: a message's parent is the message it answers or follows
(None for a first message). Regenerating a reply adds a sibling assistant message under the same
user message; editing a user message adds a sibling user message (a branch). Every node remembers
its active child (the conversation remembers its active root), so "the current conversation" is
the path obtained by following active pointers: `active_path()`.

How the app is meant to use it (one reply):

    user = store.add_message(conv.id, parent_id, "user", text)       # committed + fsynced here,
    reply = store.add_message(conv.id, user.id, "assistant", "",      # before any generation starts
                              status="generating", seed=..., sampler=...)
    prompt = store.messages_for_prompt(conv.id, user.id)             # what the engine takes
    ... generate; optionally store.update_message(reply.id, content=partial) now and then ...
    store.update_message(reply.id, content=text, status="complete", **assistant_fields_from_result(r))

Every public write is its own transaction, so each call above is durable when it returns; if it
raises StoreError (disk full...) nothing was saved and generation must not start. Each commit costs an
fsync, so save streamed text now and then (about once a second), not per token. If the
process dies mid-generation the reply row stays "generating" and the next writable open turns it
into "interrupted" (keeping the partial text last saved): the tree stays consistent.

Only the instance holding the data dir's lock (app.core.store.instance_lock) may open the store writable;
others open it with `read_only=True`. Pure Python: no Qt, no MLX.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from app.core.store.instance_lock import InstanceLock, acquire_instance_lock
from app.core.store.records import (
    DB_NAME,
    STATUSES,
    Conversation,
    Message,
    Run,
    SearchHit,
    StoreError,
    VariantPosition,
    _conversation,
    _encode_fields,
    _message,
    _run,
)
from app.core.store.documents import DocumentRows
from app.core.store.drafts import DraftRows
from app.core.store.schema import Database, default_path
from app.core.store.transfer import Transfer
from engine.documents.extract import Document
from engine.types import ROLES


class ConversationStore(Database, Transfer, DraftRows, DocumentRows):
    """All conversations of one data dir. Thread-safe (one connection behind a lock)."""

    def create_conversation(
        self, title: str = "New conversation", settings: Optional[dict[str, Any]] = None
    ) -> Conversation:
        now = time.time()
        with self._tx() as c:
            cur = c.execute(
                "INSERT INTO conversations (title, created_at, updated_at, settings) VALUES (?, ?, ?, ?)",
                (title, now, now, json.dumps(settings or {}, sort_keys=True)),
            )
            return self._get_conversation(cur.lastrowid)

    def get_conversation(self, conv_id: int) -> Conversation:
        with self._tx(write=False):
            return self._get_conversation(conv_id)

    def _get_conversation(self, conv_id: Optional[int]) -> Conversation:
        row = self._conn.execute("SELECT * FROM conversations WHERE id = ?", (conv_id,)).fetchone()
        if row is None:
            raise StoreError(f"No conversation {conv_id}")
        return _conversation(row)

    def rename_conversation(self, conv_id: int, title: str) -> Conversation:
        with self._tx():
            self._get_conversation(conv_id)
            self._conn.execute(
                "UPDATE conversations SET title = ?, updated_at = ? WHERE id = ?", (title, time.time(), conv_id)
            )
            return self._get_conversation(conv_id)

    def set_settings(self, conv_id: int, settings: dict[str, Any]) -> Conversation:
        """Replace the conversation's settings (system_prompt, sampler, mode, model)."""
        with self._tx():
            self._get_conversation(conv_id)
            self._conn.execute(
                "UPDATE conversations SET settings = ?, updated_at = ? WHERE id = ?",
                (json.dumps(settings, sort_keys=True), time.time(), conv_id),
            )
            return self._get_conversation(conv_id)

    def delete_conversation(self, conv_id: int) -> None:
        with self._tx() as c:
            self._get_conversation(conv_id)
            # Clear the cross pointers first so the bulk delete never trips a foreign key.
            c.execute("UPDATE conversations SET active_root_id = NULL WHERE id = ?", (conv_id,))
            c.execute("UPDATE messages SET active_child_id = NULL WHERE conversation_id = ?", (conv_id,))
            c.execute("DELETE FROM messages WHERE conversation_id = ?", (conv_id,))
            c.execute("DELETE FROM conversations WHERE id = ?", (conv_id,))

    def list_conversations(self) -> list[Conversation]:
        """Most recently updated first."""
        with self._tx(write=False) as c:
            rows = c.execute("SELECT * FROM conversations ORDER BY updated_at DESC, id DESC").fetchall()
        return [_conversation(r) for r in rows]

    def search(self, query: str) -> list[SearchHit]:
        """Conversations whose title contains `query` (case-insensitive), or with a message (any
        variant) that has every word of it, each as a word or a word's start (the FTS5 index,
        schema v3); a message hit's snippet comes from FTS5's snippet(), around the matched words."""
        q = query.casefold()
        if not q:
            return []
        words = re.findall(r"\w+", q)
        match = " ".join('"' + w + '"*' for w in words)  # each word a quoted prefix: no FTS syntax
        with self._tx(write=False) as c:
            found: dict[int, int] = {}
            if match:
                for cid, mid in c.execute(
                    """SELECT m.conversation_id, MIN(m.id) FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid
                       WHERE messages_fts MATCH ? GROUP BY m.conversation_id""",
                    (match,),
                ):
                    found[cid] = mid
            rows = c.execute("SELECT * FROM conversations ORDER BY updated_at DESC, id DESC").fetchall()
            hits = []
            for r in rows:
                mid = found.get(r["id"])
                if mid is not None:
                    snippet = c.execute(
                        "SELECT snippet(messages_fts, 0, '', '', '…', 12) FROM messages_fts WHERE messages_fts MATCH ? AND rowid = ?",
                        (match, mid),
                    ).fetchone()[0]
                    hits.append(SearchHit(_conversation(r), mid, " ".join(snippet.split())))
                elif q in r["title"].casefold():
                    hits.append(SearchHit(_conversation(r), None, _snippet(r["title"], query)))
        return hits

    # ---- messages

    def add_message(
        self, conv_id: int, parent_id: Optional[int], role: str, content: str,
        status: str = "complete", documents: Sequence[Document] = (), **assistant_fields: Any,
    ) -> Message:  # fmt: skip
        """Append a message under `parent_id` (None: a first message) and make it the active child.

        Committed and fsynced when this returns: save the user's message with this *before* starting
        a generation. A reply can be created up front with status="generating" and finished with
        `update_message`. A second child under the same parent is a variant (regenerate) or a branch.
        `documents` (a user message's attachments) are saved with it, in the same transaction.
        """
        if documents and role != "user":
            raise StoreError("only a user message can carry documents")
        with self._tx():
            message = self._insert_message(conv_id, parent_id, role, content, status, assistant_fields)
            self._add_documents(message.id, documents)
            return message

    def _insert_message(
        self, conv_id: int, parent_id: Optional[int], role: str, content: str,
        status: str, assistant_fields: dict[str, Any], created_at: Optional[float] = None,
    ) -> Message:  # fmt: skip
        if role not in ROLES:
            raise StoreError(f"unknown role {role!r} (expected one of {', '.join(ROLES)})")
        if status not in STATUSES:
            raise StoreError(f"unknown status {status!r} (expected one of {', '.join(STATUSES)})")
        if not isinstance(content, str):
            raise StoreError("message content must be a string")
        self._get_conversation(conv_id)
        if parent_id is not None and self._get_message(parent_id).conversation_id != conv_id:
            raise StoreError(f"message {parent_id} is not in conversation {conv_id}")
        cols = {
            "conversation_id": conv_id, "parent_id": parent_id, "role": role, "content": content,
            "created_at": time.time() if created_at is None else created_at, "status": status,
            **_encode_fields(assistant_fields),
        }  # fmt: skip
        names = ", ".join(cols)
        marks = ", ".join(f":{k}" for k in cols)
        new_id = self._conn.execute(f"INSERT INTO messages ({names}) VALUES ({marks})", cols).lastrowid
        self._point_parent_at(conv_id, parent_id, new_id)
        self._touch(conv_id)
        return self._get_message(new_id)

    def _point_parent_at(self, conv_id: int, parent_id: Optional[int], child_id: Optional[int]) -> None:
        if parent_id is None:
            self._conn.execute("UPDATE conversations SET active_root_id = ? WHERE id = ?", (child_id, conv_id))
        else:
            self._conn.execute("UPDATE messages SET active_child_id = ? WHERE id = ?", (child_id, parent_id))

    def _touch(self, conv_id: int) -> None:
        self._conn.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (time.time(), conv_id))

    def update_message(
        self, message_id: int, *, content: Optional[str] = None, status: Optional[str] = None,
        **assistant_fields: Any,
    ) -> Message:  # fmt: skip
        """Change a message in place (streaming text, then the final reply and its metadata).

        Meant for replies being generated; to change what the user wrote, use `edit_message`, which
        keeps the original as a variant.
        """
        cols = _encode_fields(assistant_fields)
        if content is not None:
            if not isinstance(content, str):
                raise StoreError("message content must be a string")
            cols["content"] = content
        if status is not None:
            if status not in STATUSES:
                raise StoreError(f"unknown status {status!r} (expected one of {', '.join(STATUSES)})")
            cols["status"] = status
        with self._tx() as c:
            msg = self._get_message(message_id)
            if cols:
                sets = ", ".join(f"{k} = :{k}" for k in cols)
                c.execute(f"UPDATE messages SET {sets} WHERE id = :id", {**cols, "id": message_id})
                self._touch(msg.conversation_id)
            return self._get_message(message_id)

    def edit_message(self, message_id: int, content: str) -> Message:
        """Edit as a branch: a new sibling with the same parent and role becomes active; the original
        (and the replies under it) stay reachable as the other variant."""
        with self._tx():
            old = self._get_message(message_id)
            edited = self._insert_message(old.conversation_id, old.parent_id, old.role, content, "complete", {})
            self._copy_documents(old.id, edited.id)  # the branch asks about the same files
            return edited

    def get_message(self, message_id: int) -> Message:
        with self._tx(write=False):
            return self._get_message(message_id)

    def _get_message(self, message_id: Optional[int]) -> Message:
        row = self._conn.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            raise StoreError(f"No message {message_id}")
        return _message(row)

    def messages(self, conv_id: int) -> list[Message]:
        """Every message of the conversation (all variants), oldest first."""
        with self._tx(write=False) as c:
            self._get_conversation(conv_id)
            rows = c.execute("SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", (conv_id,))
            return [_message(r) for r in rows]

    def children(self, message_id: int) -> list[Message]:
        with self._tx(write=False) as c:
            rows = c.execute("SELECT * FROM messages WHERE parent_id = ? ORDER BY id", (message_id,))
            return [_message(r) for r in rows]

    def siblings(self, message_id: int) -> list[Message]:
        """The message and its alternatives (same parent, or all first messages), oldest first."""
        with self._tx(write=False):
            return self._siblings(self._get_message(message_id))

    def _siblings(self, msg: Message) -> list[Message]:
        if msg.parent_id is None:
            rows = self._conn.execute(
                "SELECT * FROM messages WHERE conversation_id = ? AND parent_id IS NULL ORDER BY id",
                (msg.conversation_id,),
            )
        else:
            rows = self._conn.execute("SELECT * FROM messages WHERE parent_id = ? ORDER BY id", (msg.parent_id,))
        return [_message(r) for r in rows]

    def position(self, message_id: int) -> VariantPosition:
        """Which variant this is: str(store.position(id)) == "2 / 3"."""
        sibs = self.siblings(message_id)
        return VariantPosition([m.id for m in sibs].index(message_id) + 1, len(sibs))

    def active_path(self, conv_id: int) -> list[Message]:
        """The current conversation: from the active root, following active children."""
        with self._tx(write=False) as c:
            self._get_conversation(conv_id)
            rows = c.execute(
                """WITH RECURSIVE path(id, depth) AS (
                       SELECT active_root_id, 0 FROM conversations WHERE id = ? AND active_root_id IS NOT NULL
                       UNION ALL
                       SELECT m.active_child_id, path.depth + 1 FROM messages m JOIN path ON m.id = path.id
                       WHERE m.active_child_id IS NOT NULL)
                   SELECT m.* FROM path JOIN messages m ON m.id = path.id ORDER BY path.depth""",
                (conv_id,),
            ).fetchall()
        return [_message(r) for r in rows]

    def _ancestry(self, message_id: int) -> list[Message]:
        """Root .. message, inclusive."""
        rows = self._conn.execute(
            """WITH RECURSIVE up(id, depth) AS (
                   SELECT ?, 0
                   UNION ALL
                   SELECT m.parent_id, up.depth + 1 FROM messages m JOIN up ON m.id = up.id
                   WHERE m.parent_id IS NOT NULL)
               SELECT m.* FROM up JOIN messages m ON m.id = up.id ORDER BY up.depth DESC""",
            (message_id,),
        ).fetchall()
        if not rows:
            raise StoreError(f"No message {message_id}")
        return [_message(r) for r in rows]

    def set_active(self, message_id: int) -> list[Message]:
        """Switch variant / branch: make this message (and so its ancestors) part of the active path.
        Returns the new active path."""
        with self._tx():
            chain = self._ancestry(message_id)
            conv_id = chain[0].conversation_id
            for parent, child in zip([None, *chain[:-1]], chain):
                self._point_parent_at(conv_id, parent.id if parent else None, child.id)
            return self.active_path(conv_id)

    def delete_message(self, message_id: int) -> None:
        """Delete a message and everything under it. If it was the active child, the nearest sibling
        (the previous one, else the next) becomes active."""
        with self._tx() as c:
            msg = self._get_message(message_id)
            sibs = [m.id for m in self._siblings(msg)]
            i = sibs.index(message_id)
            rest = sibs[:i] + sibs[i + 1 :]
            heir = sibs[i - 1] if i > 0 else (rest[0] if rest else None)
            if msg.parent_id is None:
                active = self._get_conversation(msg.conversation_id).active_root_id
            else:
                active = self._get_message(msg.parent_id).active_child_id
            if active == message_id:
                self._point_parent_at(msg.conversation_id, msg.parent_id, heir)
            ids = [
                r[0]
                for r in c.execute(
                    """WITH RECURSIVE sub(id) AS (SELECT ? UNION ALL
                           SELECT m.id FROM messages m JOIN sub ON m.parent_id = sub.id)
                       SELECT id FROM sub""",
                    (message_id,),
                )
            ]
            marks = ",".join("?" * len(ids))
            c.execute(f"UPDATE messages SET active_child_id = NULL WHERE id IN ({marks})", ids)
            c.execute(f"DELETE FROM messages WHERE id IN ({marks})", ids)
            self._touch(msg.conversation_id)

    # ---- runs

    def add_run(self, message_id: int, seed: Optional[int], finish_reason: Optional[str], n_tokens: int,
                report: dict[str, Any], outcome: dict[str, Any]) -> Run:
        """Record one generation of a reply: the engine's report (CacheReport.to_dict) and how it
        compared (ReplyOutcome.to_dict)."""
        with self._tx() as c:
            self._get_message(message_id)
            run_id = c.execute(
                "INSERT INTO runs (message_id, created_at, seed, finish_reason, n_tokens, report, outcome)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (message_id, time.time(), seed, finish_reason, n_tokens, json.dumps(report, sort_keys=True),
                 json.dumps(outcome, sort_keys=True)),
            ).lastrowid
            return _run(c.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone())

    def runs(self, conv_id: int) -> dict[int, list[Run]]:
        """Every run of the conversation's replies, by message id, oldest first."""
        with self._tx(write=False) as c:
            rows = c.execute(
                """SELECT r.* FROM runs r JOIN messages m ON m.id = r.message_id
                   WHERE m.conversation_id = ? ORDER BY r.id""", (conv_id,))
            out: dict[int, list[Run]] = {}
            for row in rows:
                out.setdefault(row["message_id"], []).append(_run(row))
            return out

    def messages_for_prompt(self, conv_id: int, upto_message_id: int) -> list[dict[str, str]]:
        """The OpenAI-style list for the engine: the system prompt (if set), then root .. upto_message_id
        inclusive. Pass the user message a reply answers (for a regenerate too: the reply's parent)."""
        with self._tx(write=False):
            conv = self._get_conversation(conv_id)
            chain = self._ancestry(upto_message_id)
            if chain[0].conversation_id != conv_id:
                raise StoreError(f"message {upto_message_id} is not in conversation {conv_id}")
        out: list[dict[str, str]] = []
        system = conv.settings.get("system_prompt")
        if system:
            out.append({"role": "system", "content": system})
        out += [{"role": m.role, "content": m.content} for m in chain]
        return out

    # ---- checks


def open_app_store(data_dir: Optional[Union[str, Path]] = None) -> tuple[ConversationStore, Optional[InstanceLock]]:
    """How the app opens its data: writable with the instance lock held (keep the lock for the
    app's lifetime), else read-only with None (another instance owns the data; tell the user).
    An app that prefers to refuse instead uses `app.core.store.instance_lock.require_instance_lock`."""
    path = Path(data_dir) / DB_NAME if data_dir is not None else default_path()
    lock = acquire_instance_lock(path.parent)
    if lock is None:
        return ConversationStore(path, read_only=True), None
    try:
        return ConversationStore(path), lock
    except BaseException:
        lock.release()
        raise



def _snippet(text: str, query: str, width: int = 60) -> str:
    i = max(text.lower().find(query.lower()), 0)
    start = max(i - width // 2, 0)
    out = text[start : start + width + len(query)].replace("\n", " ")
    return ("…" if start else "") + out + ("…" if start + width + len(query) < len(text) else "")


