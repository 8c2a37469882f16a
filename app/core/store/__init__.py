"""The conversation store: every conversation and every variant of every reply, in SQLite.

    records.py        rows (Conversation, Message, Run, ReplyOutcome, ...) and their column encoding
    schema.py         migrations and the connection (open, check, upgrade, one transaction at a time)
    conversations.py  ConversationStore: conversations, the message tree, search; open_app_store
    transfer.py       export / import (Verbatim JSON, Markdown) and the tree checks

Everything callers use is re-exported here: `from app.core.store import ConversationStore`.
"""

from app.core.store.conversations import ConversationStore, open_app_store
from app.core.store.records import (
    APPLICATION_ID,
    ASSISTANT_FIELDS,
    DB_NAME,
    EXPORT_FORMAT,
    EXPORT_VERSION,
    STATUSES,
    Conversation,
    Message,
    ReplyOutcome,
    Run,
    SearchHit,
    StoreError,
    VariantPosition,
    assistant_fields_from_result,
)
from app.core.store.schema import MIGRATIONS, SCHEMA_VERSION, default_path, migrate

__all__ = [
    "APPLICATION_ID", "ASSISTANT_FIELDS", "DB_NAME", "EXPORT_FORMAT", "EXPORT_VERSION", "MIGRATIONS",
    "SCHEMA_VERSION", "STATUSES", "Conversation", "ConversationStore", "Message", "ReplyOutcome", "Run", "SearchHit",
    "StoreError", "VariantPosition", "assistant_fields_from_result", "default_path", "migrate", "open_app_store",
]  # fmt: skip
