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

Only the instance holding the data dir's lock (app.core.instance_lock) may open the store writable;
others open it with `read_only=True`. Pure Python: no Qt, no MLX.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import threading
import time
from array import array
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence, Union

from app.core.instance_lock import InstanceLock, acquire_instance_lock
from engine.paths import data_dir
from engine.types import ROLES, CacheReport, Comparison

DB_NAME = "verbatim.sqlite3"
APPLICATION_ID = 0x56425442  # "VBTB": tells our file apart from any other SQLite database
STATUSES = ("complete", "generating", "interrupted")
ASSISTANT_FIELDS = (
    "seed", "sampler", "model_key", "model_name", "tokens", "logprobs",
    "finish_reason", "cache_report", "timings",
)  # fmt: skip
_JSON_FIELDS = ("sampler", "cache_report", "timings")
EXPORT_FORMAT = "verbatim.conversation"
# Message fields written to JSON as they are; ids are replaced by file-local ones.
_EXPORTED_FIELDS = ("role", "content", "created_at", "status", *ASSISTANT_FIELDS)
EXPORT_VERSION = 1


class StoreError(Exception):
    """Anything the user should be told about the store (corrupt file, newer schema, read-only...)."""


# --------------------------------------------------------------------------- rows


@dataclass
class Conversation:
    id: int
    title: str
    created_at: float  # unix seconds
    updated_at: float
    settings: dict[str, Any] = field(default_factory=dict)  # system_prompt, sampler, mode, model
    active_root_id: Optional[int] = None


@dataclass
class Message:
    id: int
    conversation_id: int
    parent_id: Optional[int]
    role: str
    content: str
    created_at: float
    status: str = "complete"  # "complete" | "generating" | "interrupted"
    active_child_id: Optional[int] = None
    # Assistant replies (None elsewhere):
    seed: Optional[int] = None
    sampler: Optional[dict[str, Any]] = None
    model_key: Optional[str] = None
    model_name: Optional[str] = None
    tokens: Optional[list[int]] = None
    logprobs: Optional[list[float]] = None  # bit-exact (stored as float64)
    finish_reason: Optional[str] = None
    cache_report: Optional[dict[str, Any]] = None  # CacheReport.to_dict() | ReplyOutcome.to_dict()
    timings: Optional[dict[str, Any]] = None

    @property
    def report(self) -> Optional[CacheReport]:
        """The engine's report for this reply, typed (None when nothing was generated yet)."""
        return CacheReport.from_dict(self.cache_report) if self.cache_report else None

    @property
    def outcome(self) -> "ReplyOutcome":
        return ReplyOutcome.from_dict(self.cache_report)


@dataclass(frozen=True)
class ReplyOutcome:
    """What the chat session adds to the engine's report: why a reply was made and how it compares
    with the variant it was made to replace. Stored flat in the same JSON column as the report
    (keys action, previous_id, identical, first_diff, max_logprob_diff), as it always was."""

    action: str = ""  # "send" | "regenerate" | "variant" | "edit" | "retry" ("" for old rows)
    previous_id: Optional[int] = None
    comparison: Optional[Comparison] = None  # None: nothing to compare with

    def to_dict(self) -> dict[str, Any]:
        c = self.comparison
        return {
            "action": self.action,
            "previous_id": self.previous_id,
            "identical": None if c is None else c.identical,
            "first_diff": None if c is None else c.first_diff,
            "max_logprob_diff": None if c is None else c.max_logprob_diff,
        }

    @classmethod
    def from_dict(cls, d: Optional[dict[str, Any]]) -> "ReplyOutcome":
        d = d or {}
        comparison = None
        if d.get("identical") is not None:
            comparison = Comparison(bool(d["identical"]), d.get("first_diff"), float(d.get("max_logprob_diff") or 0.0))
        previous = d.get("previous_id")
        return cls(str(d.get("action") or ""), previous if isinstance(previous, int) else None, comparison)


@dataclass(frozen=True)
class VariantPosition:
    """Where a message sits among its siblings; str() gives the "2 / 3" the GUI shows."""

    index: int  # 1-based
    count: int

    def __str__(self) -> str:
        return f"{self.index} / {self.count}"


@dataclass
class SearchHit:
    conversation: Conversation
    message_id: Optional[int]  # first matching message, None when only the title matched
    snippet: str


# --------------------------------------------------------------------------- schema

# MIGRATIONS[i] takes the schema from version i to i + 1. Append only; never edit a shipped step.
MIGRATIONS: list[Sequence[str]] = [
    # v1: conversations and the message tree.
    (
        f"PRAGMA application_id = {APPLICATION_ID}",
        """CREATE TABLE conversations (
            id INTEGER PRIMARY KEY,
            title TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            settings TEXT NOT NULL DEFAULT '{}',
            active_root_id INTEGER REFERENCES messages(id) ON DELETE SET NULL
        )""",
        """CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            parent_id INTEGER REFERENCES messages(id),
            role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
            content TEXT NOT NULL,
            created_at REAL NOT NULL,
            status TEXT NOT NULL DEFAULT 'complete'
                CHECK (status IN ('complete', 'generating', 'interrupted')),
            active_child_id INTEGER REFERENCES messages(id) ON DELETE SET NULL,
            seed INTEGER,
            sampler TEXT,
            model_key TEXT,
            model_name TEXT,
            tokens BLOB,
            logprobs BLOB,
            finish_reason TEXT,
            cache_report TEXT,
            timings TEXT
        )""",
    ),
    # v2: indexes for the foreign-key lookups (deleting a subtree would scan per row without them)
    # and for listing. A separate step so the upgrade path is exercised from the first release.
    (
        "CREATE INDEX messages_conversation ON messages(conversation_id)",
        "CREATE INDEX messages_parent ON messages(parent_id)",
        "CREATE INDEX messages_active_child ON messages(active_child_id)",
        "CREATE INDEX conversations_updated ON conversations(updated_at)",
    ),
]
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(conn: sqlite3.Connection, migrations: Sequence[Sequence[str]] = MIGRATIONS) -> int:
    """Bring `conn` (autocommit mode) up to len(migrations); each step is one transaction.

    A failing step rolls back entirely (user_version included), leaving the previous version intact.
    Returns the version reached.
    """
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    for target in range(version + 1, len(migrations) + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in migrations[target - 1]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {target}")  # transactional in SQLite
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        version = target
    return version


def default_path() -> Path:
    return data_dir() / DB_NAME


# --------------------------------------------------------------------------- encoding

_LE = sys.byteorder == "little"


def _pack(values: Optional[Sequence[Any]], code: str) -> Optional[bytes]:
    """Lists as little-endian blobs: int32 token ids, float64 logprobs (exact, NaN/inf safe)."""
    if values is None:
        return None
    a = array(code, values)
    if not _LE:
        a.byteswap()
    return a.tobytes()


def _unpack(blob: Optional[bytes], code: str) -> Optional[list[Any]]:
    if blob is None:
        return None
    a = array(code)
    a.frombytes(blob)
    if not _LE:
        a.byteswap()
    return a.tolist()


def _dump(value: Any) -> Optional[str]:
    return None if value is None else json.dumps(value, sort_keys=True)


def _load(text: Optional[str]) -> Any:
    return None if text is None else json.loads(text)


def _conversation(row: sqlite3.Row) -> Conversation:
    return Conversation(
        row["id"], row["title"], row["created_at"], row["updated_at"],
        json.loads(row["settings"]), row["active_root_id"],
    )  # fmt: skip


def _message(row: sqlite3.Row) -> Message:
    return Message(
        id=row["id"], conversation_id=row["conversation_id"], parent_id=row["parent_id"],
        role=row["role"], content=row["content"], created_at=row["created_at"],
        status=row["status"], active_child_id=row["active_child_id"], seed=row["seed"],
        sampler=_load(row["sampler"]), model_key=row["model_key"], model_name=row["model_name"],
        tokens=_unpack(row["tokens"], "i"), logprobs=_unpack(row["logprobs"], "d"),
        finish_reason=row["finish_reason"], cache_report=_load(row["cache_report"]),
        timings=_load(row["timings"]),
    )  # fmt: skip


def _encode_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """Assistant fields as column values; unknown names are a programming error."""
    unknown = set(fields) - set(ASSISTANT_FIELDS)
    if unknown:
        raise TypeError(f"unknown message field(s): {', '.join(sorted(unknown))}")
    out: dict[str, Any] = {}
    for k, v in fields.items():
        if k == "tokens":
            out[k] = _pack(v, "i")
        elif k == "logprobs":
            out[k] = _pack(v, "d")
        elif k in _JSON_FIELDS:
            out[k] = _dump(v)
        else:
            out[k] = v
    return out


def assistant_fields_from_result(result: Any, outcome: Optional[ReplyOutcome] = None) -> dict[str, Any]:
    """The assistant fields of an engine `GenerationResult`; the report column is where JSON
    appears (CacheReport.to_dict, plus the session's ReplyOutcome when given)."""
    report = result.report.to_dict()
    if outcome is not None:
        report.update(outcome.to_dict())
    return {
        "seed": result.seed,
        "sampler": report.get("sampler"),
        "model_key": report.get("model_key") or None,
        "tokens": list(result.tokens),
        "logprobs": list(result.logprobs),
        "finish_reason": result.finish_reason,
        "cache_report": report,
        "timings": {k: report.get(k) for k in ("ttft_s", "prefill_tps", "decode_tps")},
    }


# --------------------------------------------------------------------------- the store


class ConversationStore:
    """All conversations of one data dir. Thread-safe (one connection behind a lock)."""

    def __init__(self, path: Optional[Union[str, Path]] = None, read_only: bool = False) -> None:
        self.path = Path(path) if path is not None else default_path()
        self.read_only = read_only
        self._lock = threading.RLock()
        self._depth = 0  # nesting of _tx(): inner calls join the outer transaction
        self._conn = self._open()

    # ---- opening

    def _open(self) -> sqlite3.Connection:
        where = str(self.path)
        if self.read_only and not self.path.exists():
            raise StoreError(f"No conversation database at {where}.")
        if not self.read_only:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise StoreError(f"Cannot create the data folder {self.path.parent}: {e}") from e
        mode = "ro" if self.read_only else "rwc"
        try:
            conn = sqlite3.connect(
                f"{self.path.resolve().as_uri()}?mode={mode}", uri=True,
                isolation_level=None, check_same_thread=False, timeout=10.0,
            )  # fmt: skip
        except sqlite3.Error as e:
            raise StoreError(f"Cannot open the conversation database {where}: {e}") from e
        try:
            conn.row_factory = sqlite3.Row
            conn.create_function("vb_fold", 1, lambda s: s.casefold() if s else "", deterministic=True)
            self._check_file(conn)  # reads only: a bad file is refused before anything is written
            if self.read_only:
                conn.execute("PRAGMA query_only = ON")
            else:
                conn.execute("PRAGMA journal_mode = WAL")
                # A returned commit survives power loss: fsync per commit, and on macOS F_FULLFSYNC
                # (plain fsync there does not flush the drive's cache). A few ms per commit.
                conn.execute("PRAGMA synchronous = FULL")
                conn.execute("PRAGMA fullfsync = ON")
                conn.execute("PRAGMA foreign_keys = ON")
                self._upgrade(conn)
                # A row still "generating" was being written by a process that died (we hold the
                # instance lock, so no live writer exists): keep its partial text, mark it.
                conn.execute("UPDATE messages SET status = 'interrupted' WHERE status = 'generating'")
        except StoreError:
            conn.close()
            raise
        except sqlite3.Error as e:
            conn.close()
            raise StoreError(f"Cannot open the conversation database {where}: {e}") from e
        return conn

    def _check_file(self, conn: sqlite3.Connection) -> None:
        where = str(self.path)
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        except sqlite3.DatabaseError as e:
            raise StoreError(
                f"The conversation database {where} is damaged or not a database ({e}). "
                "It was left untouched; move it aside (or restore a backup) to start again."
            ) from e
        if app_id not in (0, APPLICATION_ID) or (version == 0 and tables > 0):
            raise StoreError(f"{where} is an SQLite file that does not belong to Verbatim; left untouched.")
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"The conversation database {where} was written by a newer Verbatim (schema {version}, "
                f"this version understands up to {SCHEMA_VERSION}). Update Verbatim; nothing was changed."
            )
        if self.read_only and version < SCHEMA_VERSION:
            raise StoreError(
                f"The conversation database {where} (schema {version}) needs an upgrade, "
                "which a read-only instance cannot do. Open it in the main Verbatim window first."
            )
        if version > 0:
            problems = [r[0] for r in conn.execute("PRAGMA quick_check")]
            if problems != ["ok"]:
                raise StoreError(
                    f"The conversation database {where} is damaged ({problems[0]}). "
                    "It was left untouched; restore a backup or move it aside to start again."
                )

    def _upgrade(self, conn: sqlite3.Connection) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if 0 < version < SCHEMA_VERSION:
            # Keep the pre-upgrade file: a migration bug must not be able to cost conversations.
            backup = self.path.with_name(f"{self.path.name}.v{version}.bak")
            dest = sqlite3.connect(backup)
            try:
                conn.backup(dest)
            finally:
                dest.close()
        migrate(conn)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> "ConversationStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- transactions

    @contextmanager
    def _tx(self, write: bool = True) -> Iterator[sqlite3.Connection]:
        """One transaction (IMMEDIATE for writes); nested calls join it. sqlite errors -> StoreError."""
        if write and self.read_only:
            raise StoreError("The conversation store is open read-only (another Verbatim window owns it).")
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield self._conn
                finally:
                    self._depth -= 1
                return
            self._conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            self._depth = 1
            try:
                yield self._conn
            except BaseException as e:
                self._depth = 0
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                if isinstance(e, sqlite3.Error):
                    raise StoreError(f"Conversation store error: {e}") from e
                raise
            self._depth = 0
            try:
                self._conn.execute("COMMIT")
            except sqlite3.Error as e:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise StoreError(f"Could not save to the conversation store: {e}") from e

    # ---- conversations

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
        """Conversations whose title or any message (every variant) contains `query`, case-insensitive."""
        q = query.casefold()
        if not q:
            return []
        with self._tx(write=False) as c:
            rows = c.execute(
                """SELECT conv.*, (SELECT m.id FROM messages m WHERE m.conversation_id = conv.id
                                   AND instr(vb_fold(m.content), :q) > 0 ORDER BY m.id LIMIT 1) AS hit
                   FROM conversations conv
                   WHERE instr(vb_fold(conv.title), :q) > 0 OR hit IS NOT NULL
                   ORDER BY conv.updated_at DESC, conv.id DESC""",
                {"q": q},
            ).fetchall()
            hits = []
            for r in rows:
                text = r["title"]
                if r["hit"] is not None:
                    text = c.execute("SELECT content FROM messages WHERE id = ?", (r["hit"],)).fetchone()[0]
                hits.append(SearchHit(_conversation(r), r["hit"], _snippet(text, query)))
        return hits

    # ---- messages

    def add_message(
        self, conv_id: int, parent_id: Optional[int], role: str, content: str,
        status: str = "complete", **assistant_fields: Any,
    ) -> Message:  # fmt: skip
        """Append a message under `parent_id` (None: a first message) and make it the active child.

        Committed and fsynced when this returns: save the user's message with this *before* starting
        a generation. A reply can be created up front with status="generating" and finished with
        `update_message`. A second child under the same parent is a variant (regenerate) or a branch.
        """
        with self._tx():
            return self._insert_message(conv_id, parent_id, role, content, status, assistant_fields)

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
            return self._insert_message(old.conversation_id, old.parent_id, old.role, content, "complete", {})

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

    def integrity_check(self) -> str:
        """SQLite's full integrity check: "ok" or the first problem."""
        with self._tx(write=False) as c:
            return c.execute("PRAGMA integrity_check").fetchone()[0]

    def tree_problems(self, conv_id: Optional[int] = None) -> list[str]:
        """Structural problems (should always be empty): orphans, cross-conversation parents,
        active pointers that are not a child, foreign-key violations."""
        where, args = ("WHERE m.conversation_id = ?", (conv_id,)) if conv_id is not None else ("", ())
        problems: list[str] = []
        with self._tx(write=False) as c:
            for r in c.execute(
                f"""SELECT m.id, m.parent_id, p.id AS pid, p.conversation_id AS pconv, m.conversation_id AS conv
                    FROM messages m LEFT JOIN messages p ON p.id = m.parent_id {where}""",
                args,
            ):
                if r["parent_id"] is not None and r["pid"] is None:
                    problems.append(f"message {r['id']}: parent {r['parent_id']} missing")
                elif r["pid"] is not None and r["pconv"] != r["conv"]:
                    problems.append(f"message {r['id']}: parent in another conversation")
            for r in c.execute(
                f"""SELECT m.id, m.active_child_id FROM messages m LEFT JOIN messages ch
                    ON ch.id = m.active_child_id {where}
                    {'AND' if where else 'WHERE'} m.active_child_id IS NOT NULL
                    AND (ch.id IS NULL OR ch.parent_id IS NOT m.id)""",
                args,
            ):
                problems.append(f"message {r['id']}: active child {r['active_child_id']} is not its child")
            cwhere = "AND conv.id = ?" if conv_id is not None else ""
            for r in c.execute(
                f"""SELECT conv.id, conv.active_root_id FROM conversations conv
                    LEFT JOIN messages m ON m.id = conv.active_root_id
                    WHERE conv.active_root_id IS NOT NULL {cwhere}
                    AND (m.id IS NULL OR m.parent_id IS NOT NULL OR m.conversation_id != conv.id)""",
                args,
            ):
                problems.append(f"conversation {r['id']}: active root {r['active_root_id']} is not a first message")
            for r in c.execute(
                f"""SELECT conv.id FROM conversations conv WHERE conv.active_root_id IS NULL {cwhere}
                    AND EXISTS (SELECT 1 FROM messages m WHERE m.conversation_id = conv.id)""",
                args,
            ):
                problems.append(f"conversation {r['id']}: has messages but no active root")
            for r in c.execute("PRAGMA foreign_key_check"):
                problems.append(f"foreign key violation in {r[0]} row {r[1]}")
        return problems

    # ---- export / import

    def export_json(self, conv_id: int) -> str:
        """The whole tree (every variant, all metadata) as JSON; `import_json` restores it exactly.
        Message ids in the file are local (1..n, oldest first), not database ids."""
        with self._tx(write=False):
            conv = self._get_conversation(conv_id)
            msgs = self.messages(conv_id)
        local = {m.id: i + 1 for i, m in enumerate(msgs)}
        doc = {
            "format": EXPORT_FORMAT,
            "version": EXPORT_VERSION,
            "conversation": {
                "title": conv.title, "created_at": conv.created_at, "updated_at": conv.updated_at,
                "settings": conv.settings, "active_root": local.get(conv.active_root_id),
            },  # fmt: skip
            "messages": [
                {
                    **{k: getattr(m, k) for k in _EXPORTED_FIELDS},
                    "id": local[m.id],
                    "parent": local.get(m.parent_id),
                    "active_child": local.get(m.active_child_id),
                }
                for m in msgs
            ],
        }
        return json.dumps(doc, indent=1, ensure_ascii=False)

    def import_json(self, text: Union[str, bytes]) -> Conversation:
        """Import an `export_json` document as a new conversation, all or nothing."""
        try:
            doc = json.loads(text)
        except (ValueError, TypeError) as e:
            raise StoreError(f"Not a Verbatim conversation file: invalid JSON ({e})") from e
        conv, msgs = _validate_export(doc)
        with self._tx() as c:
            cur = c.execute(
                "INSERT INTO conversations (title, created_at, updated_at, settings) VALUES (?, ?, ?, ?)",
                (conv["title"], conv["created_at"], conv["updated_at"], json.dumps(conv["settings"], sort_keys=True)),
            )
            new_conv = cur.lastrowid
            ids: dict[int, int] = {}
            for m in msgs:
                fields = {k: m.get(k) for k in ASSISTANT_FIELDS}
                cols = {
                    "conversation_id": new_conv, "parent_id": ids.get(m["parent"]), "role": m["role"],
                    "content": m["content"], "created_at": m["created_at"],
                    # A reply exported mid-generation is not being generated here.
                    "status": "interrupted" if m["status"] == "generating" else m["status"],
                    **_encode_fields(fields),
                }  # fmt: skip
                names = ", ".join(cols)
                marks = ", ".join(f":{k}" for k in cols)
                ids[m["id"]] = c.execute(f"INSERT INTO messages ({names}) VALUES ({marks})", cols).lastrowid
            for m in msgs:
                if m["active_child"] is not None:
                    c.execute(
                        "UPDATE messages SET active_child_id = ? WHERE id = ?", (ids[m["active_child"]], ids[m["id"]])
                    )
            c.execute(
                "UPDATE conversations SET active_root_id = ? WHERE id = ?", (ids.get(conv["active_root"]), new_conv)
            )
            return self._get_conversation(new_conv)

    def export_markdown(self, conv_id: int) -> str:
        """The active path as readable Markdown (variants noted as "reply 2 / 3")."""
        with self._tx(write=False):
            conv = self._get_conversation(conv_id)
            path = self.active_path(conv_id)
            positions = {m.id: self.position(m.id) for m in path}
        lines = [f"# {conv.title}", "", f"*Exported from Verbatim. Created {_when(conv.created_at)}.*", ""]
        system = conv.settings.get("system_prompt")
        if system:
            lines += ["## System", "", system, ""]
        for m in path:
            head = m.role.capitalize()
            notes = []
            pos = positions[m.id]
            if pos.count > 1:
                notes.append(f"variant {pos}")
            if m.model_name or m.model_key:
                notes.append(f"model {m.model_name or m.model_key}")
            if m.seed is not None:
                notes.append(f"seed {m.seed}")
            if m.status != "complete":
                notes.append(m.status)
            lines += [f"## {head}" + (f" ({', '.join(notes)})" if notes else ""), "", m.content, ""]
        return "\n".join(lines).rstrip() + "\n"


def open_app_store(data_dir: Optional[Union[str, Path]] = None) -> tuple[ConversationStore, Optional[InstanceLock]]:
    """How the app opens its data: writable with the instance lock held (keep the lock for the
    app's lifetime), else read-only with None (another instance owns the data; tell the user).
    An app that prefers to refuse instead uses `app.core.instance_lock.require_instance_lock`."""
    path = Path(data_dir) / DB_NAME if data_dir is not None else default_path()
    lock = acquire_instance_lock(path.parent)
    if lock is None:
        return ConversationStore(path, read_only=True), None
    try:
        return ConversationStore(path), lock
    except BaseException:
        lock.release()
        raise


# --------------------------------------------------------------------------- helpers


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _snippet(text: str, query: str, width: int = 60) -> str:
    i = max(text.lower().find(query.lower()), 0)
    start = max(i - width // 2, 0)
    out = text[start : start + width + len(query)].replace("\n", " ")
    return ("…" if start else "") + out + ("…" if start + width + len(query) < len(text) else "")


def _validate_export(doc: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Check an export document completely before anything is written; StoreError says what is wrong."""
    try:
        return _check_export(doc)
    except (TypeError, AttributeError, KeyError) as e:  # e.g. an id that is a list
        raise StoreError(f"Not a valid Verbatim conversation file: {e}") from e


def _check_export(doc: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:

    def bad(why: str) -> StoreError:
        return StoreError(f"Not a valid Verbatim conversation file: {why}")

    def check(cond: bool, why: str) -> None:
        if not cond:
            raise bad(why)

    num = (int, float)
    check(isinstance(doc, dict) and doc.get("format") == EXPORT_FORMAT, "missing format marker")
    check(doc.get("version") == EXPORT_VERSION, f"unsupported version {doc.get('version')!r}")
    conv, msgs = doc.get("conversation"), doc.get("messages")
    check(isinstance(conv, dict), "'conversation' must be an object")
    check(isinstance(msgs, list), "'messages' must be a list")
    check(isinstance(conv.get("title"), str), "conversation title must be a string")
    check(isinstance(conv.get("settings"), dict), "conversation settings must be an object")
    for k in ("created_at", "updated_at"):
        check(isinstance(conv.get(k), num) and not isinstance(conv.get(k), bool), f"conversation {k} must be a number")
    optional: dict[str, Callable[[Any], bool]] = {
        "seed": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "sampler": lambda v: isinstance(v, dict),
        "model_key": lambda v: isinstance(v, str),
        "model_name": lambda v: isinstance(v, str),
        "tokens": lambda v: isinstance(v, list) and all(type(t) is int and -(2**31) <= t < 2**31 for t in v),
        "logprobs": lambda v: isinstance(v, list) and all(type(x) in (int, float) for x in v),
        "finish_reason": lambda v: isinstance(v, str),
        "cache_report": lambda v: isinstance(v, dict),
        "timings": lambda v: isinstance(v, dict),
    }
    seen: dict[int, dict[str, Any]] = {}
    for n, m in enumerate(msgs):
        where = f"message #{n + 1}"
        check(isinstance(m, dict), f"{where} must be an object")
        mid = m.get("id")
        check(type(mid) is int and mid not in seen, f"{where} has a missing or duplicate id")
        check(m.get("parent") is None or m.get("parent") in seen, f"{where} refers to an unknown or later parent")
        check(m.get("role") in ROLES, f"{where} has an unknown role")
        check(isinstance(m.get("content"), str), f"{where} content must be a string")
        check(m.get("status", "complete") in STATUSES, f"{where} has an unknown status")
        check(type(m.get("created_at")) in (int, float), f"{where} created_at must be a number")
        for k, ok in optional.items():
            check(m.get(k) is None or ok(m[k]), f"{where} has an invalid {k}")
        m = {**m, "status": m.get("status", "complete"), "active_child": m.get("active_child")}
        seen[mid] = m
    for m in seen.values():
        ch = m["active_child"]
        ok = ch is None or (ch in seen and seen[ch]["parent"] == m["id"])
        check(ok, f"message id {m['id']} has an invalid active child")
    root = conv.get("active_root")
    check(
        root is None and not seen or (root in seen and seen[root]["parent"] is None),
        "the active first message is missing or not a first message",
    )
    return conv, list(seen.values())
