"""Each conversation's unsent draft, in the store (schema v5): what was typed and not sent
survives quitting. Conversation 0 is the new chat that has no row yet."""

from __future__ import annotations

import time
from typing import Optional

NEW_CHAT = 0  # the drafts row of the chat not saved yet


class DraftRows:
    """Mixed into ConversationStore (uses its transactions)."""

    def draft(self, conv_id: Optional[int]) -> str:
        """The draft kept for `conv_id` (None: the new chat), '' when there is none."""
        with self._tx(write=False) as c:  # type: ignore[attr-defined]
            row = c.execute("SELECT text FROM drafts WHERE conversation_id = ?", (conv_id or NEW_CHAT,)).fetchone()
        return str(row[0]) if row is not None else ""

    def set_draft(self, conv_id: Optional[int], text: str) -> None:
        """Keep `text` as the draft of `conv_id`; an empty (blank) one removes it."""
        key = conv_id or NEW_CHAT
        with self._tx() as c:  # type: ignore[attr-defined]
            if text.strip():
                c.execute("INSERT INTO drafts (conversation_id, text, updated_at) VALUES (?, ?, ?) "
                          "ON CONFLICT(conversation_id) DO UPDATE SET text = excluded.text, "
                          "updated_at = excluded.updated_at", (key, text, time.time()))  # fmt: skip
            else:
                c.execute("DELETE FROM drafts WHERE conversation_id = ?", (key,))
