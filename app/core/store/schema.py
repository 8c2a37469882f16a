"""The store's schema (append-only migrations) and its connection: opening, checking, upgrading,
one transaction at a time."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional, Sequence, Union

from app.core.store.records import APPLICATION_ID, DB_NAME, StoreError
from engine.paths import data_dir

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
    # v3: full-text search of messages (SQLite FTS5 over the messages table, kept in step by
    # triggers): search reads an index instead of running a Python function over every message.
    (
        """CREATE VIRTUAL TABLE messages_fts USING fts5(
            content, content='messages', content_rowid='id', tokenize='unicode61 remove_diacritics 0'
        )""",
        """CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
            INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
        END""",
        """CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
            INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
        END""",
        """CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN
            INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
            INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
        END""",
        "INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')",
    ),
    # v4: a reply's runs. Each generation of a reply is a run with its own report (the first one,
    # and every regenerate that came out identical to it, which adds no copy of the message): the
    # engine's CacheReport and the session's ReplyOutcome in columns of their own (in a message's
    # cache_report they share one JSON object, where both have an "identical"). Existing replies
    # get their one run from the report stored with them.
    (
        """CREATE TABLE runs (
            id INTEGER PRIMARY KEY,
            message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
            created_at REAL NOT NULL,
            seed INTEGER,
            finish_reason TEXT,
            n_tokens INTEGER NOT NULL DEFAULT 0,
            report TEXT NOT NULL,
            outcome TEXT NOT NULL DEFAULT '{}'
        )""",
        "CREATE INDEX runs_message ON runs(message_id)",
        """INSERT INTO runs (message_id, created_at, seed, finish_reason, n_tokens, report, outcome)
           SELECT id, created_at, seed, finish_reason, COALESCE(length(tokens) / 4, 0), cache_report, cache_report
           FROM messages WHERE role = 'assistant' AND cache_report IS NOT NULL ORDER BY id""",
    ),
    # v5: each conversation's unsent draft (conversation_id 0: the new chat not saved yet), so a
    # draft survives quitting; a deleted conversation's draft goes with it.
    (
        """CREATE TABLE drafts (
            conversation_id INTEGER PRIMARY KEY,
            text TEXT NOT NULL,
            updated_at REAL NOT NULL
        )""",
        """CREATE TRIGGER drafts_conversation_delete AFTER DELETE ON conversations BEGIN
            DELETE FROM drafts WHERE conversation_id = old.id;
        END""",
    ),
    # v6: the documents attached to a user message (app/core/store/documents.py): the extracted
    # text the model reads and the file's digest, in attach order; they go with their message.
    (
        """CREATE TABLE documents (
            id INTEGER PRIMARY KEY,
            message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            name TEXT NOT NULL,
            digest TEXT NOT NULL,
            kind TEXT NOT NULL,
            pages INTEGER,
            text TEXT NOT NULL,
            UNIQUE (message_id, position)
        )""",
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


# --------------------------------------------------------------------------- the connection


class Database:
    """One SQLite connection behind a lock: opened (and created, checked, upgraded) once, used one
    transaction at a time (`_tx`). ConversationStore builds on it."""

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

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- transactions

    def transaction(self) -> "contextlib.AbstractContextManager[sqlite3.Connection]":
        """One write transaction around several store calls (they join it): one commit, one fsync."""
        return self._tx()

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

