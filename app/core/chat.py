"""One window's chat, without Qt: its sub-models, built and tied together, and nothing else.

    conversation  the open conversation: id, path (view models), selection, runs picked
    listing       the conversation list (and a search)
    composer      the message being written: the one holder of the draft and its files; the budget
    generation    the reply being made: the pending reply (frozen), its stream, replay, cancel
    link          the engine: the model loaded, its chunk, where it runs (a server?), the cache's numbers
    cold_runs     a reply run again with no cache (Verify, Compare's B side, token texts)
    notices       the status line, errors, the banner, the notice

Each sub-model owns its fields and its typed signals (psygnal): only its own methods write them
and emit them (tests/app/test_ownership.py checks it). What one sub-model's change means for
another is tied here (a new path is counted again; a load stops the reply first), so no
sub-model reaches into another. What the user does is an operation in app/core/ops.py; the
widgets bind to the sub-model they show (app/qt).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Coroutine, Optional

from app.core.composer.drafts import Drafts
from app.core.composer.model import Composer
from app.core.conversation.listing import ConversationList
from app.core.conversation.model import Conversation
from app.core.engine_link.cold_runs import ColdRuns
from app.core.engine_link.model import EngineLink, ServerLink
from app.core.generation.model import Generation
from app.core.jobs import EngineJobs
from app.core.notices import Notices
from app.core.store import ChatSettings
from app.core.store.session import ChatSession
from engine.executor import EngineExecutor


class Chat:
    """`spawn` runs a coroutine on the GUI's asyncio loop (`loop`); `default_settings` gives the
    settings of a conversation made by a first message; `read_only`: another window owns the data
    folder (nothing is sent, no draft is written)."""

    def __init__(self, session: ChatSession, executor: EngineExecutor, loop: asyncio.AbstractEventLoop,
                 spawn: Callable[[Coroutine[Any, Any, Any]], "asyncio.Task[Any]"],
                 default_settings: Callable[[], ChatSettings] = ChatSettings, chunk: int = 512,
                 batch_interval: float = 0.05, read_only: bool = False) -> None:  # fmt: skip
        self.session = session
        self.read_only = read_only
        self.jobs = EngineJobs(executor, loop, spawn)
        self.notices = Notices()
        self.conversation = Conversation(session, default_settings)
        self.listing = ConversationList(session, self.jobs)
        self.link = EngineLink(self.jobs, session, self.notices, chunk)
        self.composer = Composer(self.jobs, self.conversation, Drafts(session.store, writable=not read_only), self.link)
        self.cold_runs = ColdRuns(self.jobs, session, self.link)
        self.generation = Generation(session, self.jobs, self.conversation, self.listing, self.composer, self.link,
                                     self.notices, batch_interval)  # fmt: skip
        # What a change of one sub-model means for another:
        self.conversation.path_changed.connect(self._path_changed)  # the meter counts this path + the draft
        self.link.loading.connect(self._model_loading)  # a reply in progress ends first (saved as interrupted)
        self.link.loaded.connect(self._model_loaded)  # another tokenizer and context: count again
        self.link.server_changed.connect(self._server_changed)

    def _path_changed(self, vms: list[Any]) -> None:
        self.composer.path_changed()

    def _model_loading(self, spec: str, name: str) -> None:
        self.generation.stop()

    def _model_loaded(self, spec: str, name: str, info: Any) -> None:
        self.composer.recount()
        if self.composer.attachments.items:  # the chips' counts change
            self.jobs.spawn(self.composer.attachments.recount())

    def _server_changed(self, server: Optional[ServerLink]) -> None:
        if server is not None and server.up:  # it answers (again): its tokenizer counts the draft
            self.composer.recount()

    def shutdown(self, timeout: float) -> bool:
        """Cancel every engine job (a reply in progress is saved as interrupted on the engine
        thread), wait for the engine thread and close the Engine. False if it did not end in time."""
        self.notices.close()
        self.listing.close()
        return self.jobs.shutdown(timeout)
