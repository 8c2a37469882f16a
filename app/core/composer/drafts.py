"""Each conversation's unsent text (no Qt): switching conversations keeps every draft where it
was typed, and the store keeps them across a restart (app/core/store/drafts.py); a new chat
starts empty."""

from __future__ import annotations

import logging
from typing import Optional, Protocol

log = logging.getLogger(__name__)


class DraftStore(Protocol):
    def draft(self, conv_id: Optional[int]) -> str: ...
    def set_draft(self, conv_id: Optional[int], text: str) -> None: ...


class Drafts:
    """The drafts, read from `store` once and written through to it on each change (None or a
    read-only store: kept while the app runs only)."""

    def __init__(self, store: Optional[DraftStore] = None, writable: bool = True) -> None:
        self.store, self.writable = store, writable
        self._text: dict[Optional[int], str] = {}  # None: the new chat not saved yet

    def switch(self, old: Optional[int], text: str, new: Optional[int]) -> str:
        """Keep `text` as the draft of `old`; the draft of `new` (to put in the composer)."""
        self.keep(old, text)
        return self.get(new)

    def keep(self, conv_id: Optional[int], text: str) -> None:
        text = text if text.strip() else ""
        if self.get(conv_id) == text:
            return
        self._text[conv_id] = text
        if self.store is not None and self.writable:
            try:
                self.store.set_draft(conv_id, text)
            except Exception as e:  # a full disk must not stop typing: the draft stays in memory
                log.warning("cannot save the draft: %s", e)

    def forget(self, conv_id: Optional[int]) -> None:
        self.keep(conv_id, "")

    def get(self, conv_id: Optional[int]) -> str:
        if conv_id not in self._text:
            text = ""
            if self.store is not None:
                try:
                    text = self.store.draft(conv_id)
                except Exception as e:
                    log.warning("cannot read the draft: %s", e)
            self._text[conv_id] = text
        return self._text[conv_id]
