"""The conversation list (no Qt): every conversation, most recent first, or what a search found
(each hit with its snippet and message). A search runs on a daemon thread (the FTS5 index; the
GUI stays live) and the latest one wins: a newer query cancels the one before. The sidebar binds
to `items_changed`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Optional

from psygnal import Signal

from app.core.conversation.view_models import ConversationItem
from app.core.jobs import EngineJobs
from app.core.store import StoreError
from app.core.store.session import ChatSession

log = logging.getLogger(__name__)


class ConversationList:
    items_changed = Signal(list)  # list[ConversationItem]
    searched = Signal(str)  # the query now in force ('': none)

    def __init__(self, session: ChatSession, jobs: EngineJobs) -> None:
        self.session, self.jobs = session, jobs
        self.query = ""
        self.items: list[ConversationItem] = []
        self._search: Optional["asyncio.Task[Any]"] = None  # the search under way
        self.closed = False  # the store is closed: nothing is read any more

    def search(self, query: str) -> None:
        """Show what `query` finds ('' : every conversation)."""
        self.query = query.strip()
        self.searched.emit(self.query)
        self.refresh()

    def refresh(self) -> None:
        """Read the list again (titles or conversations changed)."""
        if self.closed:
            return
        if self._search is not None:
            self._search.cancel()  # a newer list is coming: the older one is never shown
            self._search = None
        if not self.query:
            self._show(items(self.session, ""))
            return
        self._search = self.jobs.spawn(self._find(self.query))

    async def _find(self, query: str) -> None:
        try:
            found = await self.jobs.in_thread(items, self.session, query)
        except StoreError as e:
            log.info("search failed: %s", e)
            return
        if not self.closed:
            self._show(found)

    def _show(self, found: list[ConversationItem]) -> None:
        self.items = found
        self.items_changed.emit(found)

    def close(self) -> None:
        """The window closes: a search still under way never reaches the closed store's reader."""
        self.closed = True
        if self._search is not None:
            self._search.cancel()


def items(session: ChatSession, query: str = "") -> list[ConversationItem]:
    """The conversation list, most recent first; with a query, the matches and a snippet."""
    store = session.store
    if query:
        return [ConversationItem(h.conversation.id, h.conversation.title, h.snippet, h.message_id)
                for h in store.search(query)]
    return [ConversationItem(c.id, c.title) for c in store.list_conversations()]
