"""The open conversation (no Qt): which one, its active path as view models (each reply with its
runs), the reply picked (what Regenerate, Compare and Receipt act on: the one clicked, else the
last) and the run picked in each reply's runs menu. The chat view, the debug panel and the
buttons that act on the selected reply bind to its signals; only its own methods write its
fields and emit them.
"""

from __future__ import annotations

from typing import Callable, Optional

from psygnal import Signal

from app.core.conversation.view_models import MessageVM, message_vm, run_shown
from app.core.store import ChatSettings, Run, StoreError
from app.core.store.session import ChatSession, PendingReply
from engine.documents.extract import Document


class Conversation:
    opened = Signal(object)  # Optional[int]: another conversation is shown (None: a new, empty one)
    path_changed = Signal(list)  # list[MessageVM]: the active path as shown now
    selected_changed = Signal(object)  # Optional[MessageVM]: the reply Regenerate / Compare / Receipt act on
    runs_changed = Signal(dict)  # dict[int, int]: reply id -> the run picked in its runs menu
    settings_changed = Signal(object)  # ChatSettings: the settings in force for the next reply changed

    def __init__(self, session: ChatSession, default_settings: Callable[[], ChatSettings] = ChatSettings) -> None:
        self.session = session
        self.default_settings = default_settings  # the settings of a conversation made by a first message
        self.conv_id: Optional[int] = None
        self.vms: list[MessageVM] = []  # the active path
        self.selected_id: Optional[int] = None  # a reply the user picked (None: the last reply)
        self.runs_shown: dict[int, int] = {}  # reply id -> the run picked in its runs menu (else the latest)

    # ------------------------------------------------------------------------------ reading
    @property
    def selected(self) -> Optional[MessageVM]:
        """The reply Regenerate / Compare / Receipt act on: the one picked, else the last one."""
        replies = [vm for vm in self.vms if vm.role == "assistant"]
        picked = next((vm for vm in replies if vm.id == self.selected_id), None)
        return picked or (replies[-1] if replies else None)

    def vm(self, message_id: Optional[int]) -> Optional[MessageVM]:
        return next((vm for vm in self.vms if vm.id == message_id), None)

    def settings(self) -> ChatSettings:
        """The settings in force for the next send or new variant."""
        if self.conv_id is not None:
            try:
                return self.session.settings(self.conv_id)
            except StoreError:
                pass
        return self.default_settings()

    def path_documents(self) -> tuple[Document, ...]:
        """The documents of the conversation shown, in the order the engine places them."""
        return tuple(d for vm in self.vms for d in vm.documents)

    # ------------------------------------------------------------------------------ changes
    def use_settings(self, settings: ChatSettings, save: bool = True) -> None:
        """`settings` are in force from the next reply: the open conversation's (saved in its row
        when `save`; a new chat's are the defaults its first message is made with)."""
        if save and self.conv_id is not None:
            self.session.set_settings(self.conv_id, settings)
        self.settings_changed.emit(self.settings())

    def open(self, conv_id: Optional[int]) -> None:
        """Show a conversation (None: a new, empty one, made by its first message); the runs
        picked stay picked (reply ids are unique): reopened, they are shown."""
        self.conv_id = conv_id
        self.selected_id = None
        self.opened.emit(conv_id)
        self.reload()

    def reload(self) -> list[MessageVM]:
        """Read the active path (and its replies' runs) from the store and tell the views."""
        vms = read_path(self.session, self.conv_id) if self.conv_id is not None else []
        self.vms = [run_shown(vm, self.runs_shown[vm.id]) if vm.id in self.runs_shown else vm for vm in vms]
        if self.selected_id is not None and self.vm(self.selected_id) is None:
            self.selected_id = None
        self.path_changed.emit(self.vms)
        self.selected_changed.emit(self.selected)
        return self.vms

    def select(self, message_id: Optional[int]) -> None:
        """Pick the reply Regenerate / Compare / Receipt act on (a user message: ignored)."""
        vm = self.vm(message_id)
        if vm is None or vm.role != "assistant" or self.selected_id == vm.id:
            return
        self.selected_id = vm.id
        self.selected_changed.emit(vm)

    def show_run(self, reply_id: int, index: int) -> None:
        """Show one of a reply's runs (0: the first): the reply is selected, and its footer,
        badge and the debug panel all show that run until another is picked or a new run ends."""
        vm = self.vm(reply_id)
        if vm is None or not 0 <= index < len(vm.runs):
            return
        self.runs_shown[reply_id] = index
        self.selected_id = reply_id
        self.runs_changed.emit(dict(self.runs_shown))
        self.reload()

    def remember_runs(self, picked: dict[int, int]) -> None:
        """The runs picked in an earlier session (the window keeps them): shown as picked then."""
        self.runs_shown.update(picked)

    def follow_variant(self, message_id: int) -> None:
        """A sibling was made active: a picked reply follows it; the path is read again."""
        if self.selected_id is not None:
            self.selected_id = message_id
        self.reload()

    def follow_reply(self, pending: PendingReply) -> None:
        """A reply started: its conversation is the one shown (a send may have just made it),
        the new reply is the one acted on, and a new run of it shows (not one picked before)."""
        self.conv_id = pending.conversation_id
        self.selected_id = pending.reply_id
        picked = len(self.runs_shown)
        for rid in (pending.reply_id, pending.previous_id):
            if rid is not None:
                self.runs_shown.pop(rid, None)
        if len(self.runs_shown) != picked:
            self.runs_changed.emit(dict(self.runs_shown))
        self.reload()

    def reply_saved(self, reply_id: int) -> None:
        """A reply ended and was saved (as `reply_id`: itself, or the variant it equals)."""
        self.selected_id = reply_id
        self.reload()

    def forget(self) -> None:
        """The conversation shown is gone (a refused first send took it back): a new, empty one."""
        self.conv_id = None
        self.reload()


def read_path(session: ChatSession, conv_id: int) -> list[MessageVM]:
    """The active path of `conv_id` as view models, each reply with its runs.

    Siblings come from one read of the whole conversation (not one query per message): the
    engine thread may delete a failed reply's placeholder meanwhile, and a message that is gone
    by then simply counts as its own only variant."""
    store = session.store
    try:
        path = store.active_path(conv_id)
        messages = store.messages(conv_id)
        runs = store.runs(conv_id)
        documents = store.documents([m.id for m in path])
    except StoreError:  # the conversation was deleted meanwhile
        return []
    siblings: dict[Optional[int], list[int]] = {}
    for m in messages:  # ordered by id, as store.siblings() is
        siblings.setdefault(m.parent_id, []).append(m.id)
    out = []
    for m in path:
        own = runs.get(m.id) or [r for r in [Run.of_message(m)] if r is not None]
        out.append(message_vm(m, siblings.get(m.parent_id) or [m.id], own, documents.get(m.id, ())))
    return out
