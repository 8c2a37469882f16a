"""The conversation store: every conversation and every variant of every reply, in SQLite.

    records.py        rows (Conversation, Message, Run, ReplyOutcome, ...) and their column encoding
    schema.py         migrations and the connection (open, check, upgrade, one transaction at a time)
    conversations.py  ConversationStore: conversations, the message tree, search; open_app_store
    transfer.py       export / import (Verbatim JSON, Markdown) and the tree checks
    drafts.py, documents.py  each conversation's unsent draft; a user message's attached files
    settings.py       a conversation's settings (ChatSettings)
    session.py        a reply's life: begun (seed chosen once, request), finished, failed; receipts
    instance_lock.py  one window writes a data folder; a second one opens it read-only

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
    Action,
    Conversation,
    Message,
    ReplyOutcome,
    Run,
    SearchHit,
    StoreError,
    VariantPosition,
    assistant_fields_from_result,
    continuable,
)
from app.core.store.schema import MIGRATIONS, SCHEMA_VERSION, default_path, migrate
from app.core.store.settings import ChatSettings

__all__ = [
    "APPLICATION_ID", "ASSISTANT_FIELDS", "DB_NAME", "EXPORT_FORMAT", "EXPORT_VERSION", "MIGRATIONS",
    "SCHEMA_VERSION", "STATUSES", "Action", "ChatSettings", "Conversation", "ConversationStore", "Message", "ReplyOutcome", "Run", "SearchHit",
    "StoreError", "VariantPosition", "assistant_fields_from_result", "continuable", "default_path", "migrate", "open_app_store",
]  # fmt: skip
