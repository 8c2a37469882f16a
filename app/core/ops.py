"""What the user does to the chat, without Qt: each operation a function over the window's `Chat`
(app/core/chat.py) that checks it may run, changes the store through the session, starts the
flow, and returns what it changed (`Changed`: empty, and so false, when it did not run).

"Not while generating" is decided in one place (`idle`), and so is "not while the server the
window is attached to is away" (`reachable`). Widgets call these (or the sub-models' own intents,
such as Conversation.select) and never write the store themselves.

A regenerate, from the button to the engine: `regenerate(chat)` picks the reply (the selected
one), `ChatSession.begin_regenerate` chooses its seed once (the reply's own; a new variant's is
fresh: `choose_seed`, app/core/store/session.py) and builds the request, `Generation.start` hands
it to `engine_batches` (app/core/generation/model.py), and the engine samples with that seed.
"""

from __future__ import annotations

from dataclasses import replace
from enum import Flag, auto
from typing import Optional

from app.core.chat import Chat
from app.core.conversation.import_hint import import_error_text
from app.core.engine_link.model import NOT_SENT
from app.core.store import ChatSettings, StoreError
from app.core.store.session import PendingReply


class Changed(Flag):
    """What an operation changed (NOTHING, which is false, when it did not run)."""

    NOTHING = 0
    STORE = auto()  # rows written: a message, a reply's placeholder, a title, settings
    CONVERSATION = auto()  # the open conversation: which one, its path or its selection
    LIST = auto()  # the conversation list
    GENERATION = auto()  # a reply started, or was asked to stop
    COMPOSER = auto()  # the draft's text or its files


STARTED = Changed.STORE | Changed.CONVERSATION | Changed.LIST | Changed.GENERATION  # a reply begun


def idle(chat: Chat, say: Optional[str] = "Stop the current reply first", conv_id: Optional[int] = None) -> bool:
    """Whether no reply is being generated (with `conv_id`: none in that conversation): what
    changes the conversation waits for it, and says why on the status line (`say`; None: silently)."""
    pending = chat.generation.pending
    if pending is None or (conv_id is not None and pending.conversation_id != conv_id):
        return True
    if say:
        chat.notices.status(say, 3000)
    return False


def reachable(chat: Chat) -> bool:
    """Whether a reply can start: not while the server the window is attached to is unreachable
    (nothing is sent, so nothing typed is lost; the notice says why, whole)."""
    server = chat.link.server
    if server is None or server.up:
        return True
    why = f"{NOT_SENT}{server.error or 'the server is not reachable'}. What you typed is kept."
    chat.notices.status(why, 6000)
    chat.notices.tell(why + " Send works again as soon as the server answers.")
    return False


def writable(chat: Chat) -> bool:
    """Whether this window may write (another window owns the data folder: read-only)."""
    if chat.read_only:
        chat.notices.error("Read-only", "Another Verbatim window owns this data folder.")
    return not chat.read_only


def _start(chat: Chat, pending: PendingReply) -> Changed:
    chat.generation.start(pending)
    return STARTED


# ------------------------------------------------------------------------------------- replies
def send(chat: Chat, text: Optional[str] = None) -> Changed:
    """Send the draft (or `text`) with the files attached to it; the composer empties."""
    c = chat.composer
    text = c.text if text is None else text
    if not text.strip() or not idle(chat, None) or not writable(chat) or not reachable(chat):
        return Changed.NOTHING
    why = c.refusal(text)
    if why:  # the meter counted this very text: nothing is saved, the draft stays
        chat.notices.status(why, 8000)
        return Changed.NOTHING
    conv_id = chat.conversation.conv_id
    try:  # one transaction: the conversation (if new), the message, its files and the reply's row
        pending = chat.session.begin_send(conv_id, text, chat.link.maker, chat.conversation.default_settings(),
                                          documents=c.attachments.documents)  # fmt: skip
    except StoreError as e:
        chat.notices.error("Cannot save the message", str(e))
        return Changed.NOTHING
    c.sent(conv_id)  # sent: no longer a draft (the new chat's too)
    return _start(chat, pending) | Changed.COMPOSER


def regenerate(chat: Chat, fresh: bool = False) -> Changed:
    """Regenerate the selected reply (its own seed and settings: it must come out the same) or,
    `fresh`, make a new variant of it (a fresh seed, the current settings). A trailing user message
    that has no reply (its generation failed) is answered instead, unless a reply was picked."""
    conv = chat.conversation
    if conv.conv_id is None or not idle(chat, None) or chat.read_only or not reachable(chat):
        return Changed.NOTHING
    target = conv.selected
    try:
        if conv.vms and conv.vms[-1].role == "user" and (target is None or target.id != conv.selected_id):
            pending = chat.session.begin_reply_to(conv.vms[-1].id, chat.link.maker)
        elif target is not None:
            pending = chat.session.begin_regenerate(target.id, fresh=fresh, maker=chat.link.maker)
            ids = [vm.id for vm in conv.vms]  # a middle reply: the turns after it stay with it
            pending = replace(pending, hidden=len(ids) - ids.index(target.id) - 1 if target.id in ids else 0)
        else:
            return Changed.NOTHING
    except StoreError as e:
        chat.notices.error("Cannot regenerate", str(e))
        return Changed.NOTHING
    return _start(chat, pending)


def regenerate_reply(chat: Chat, reply_id: int) -> Changed:
    """A reply's own ↻: that reply selected and regenerated (as Regenerate does the selected one)."""
    chat.conversation.select(reply_id)
    return regenerate(chat, fresh=False)


def continue_reply(chat: Chat, reply_id: Optional[int] = None) -> Changed:
    """Continue a reply that was stopped or ended at max tokens (the selected one by default), in
    place: with its own seed and settings it goes on as the reply that was never stopped."""
    conv = chat.conversation
    if conv.conv_id is None or not idle(chat, None) or chat.read_only or not reachable(chat):
        return Changed.NOTHING
    rid = reply_id if reply_id is not None else conv.selected_id
    if rid is None:
        return Changed.NOTHING
    try:
        pending = chat.session.begin_continue(rid, chat.link.maker)
    except StoreError as e:
        chat.notices.error("Cannot continue", str(e))
        return Changed.NOTHING
    return _start(chat, pending)


def edit(chat: Chat, user_id: int, text: str) -> Changed:
    """Edit a user message as a branch and answer the edit."""
    if chat.read_only or not idle(chat, None):
        chat.notices.status("Stop the current reply first", 3000)
        return Changed.NOTHING
    if not reachable(chat):
        return Changed.NOTHING
    try:
        pending = chat.session.begin_edit(user_id, text, chat.link.maker)
    except StoreError as e:
        chat.notices.error("Cannot edit", str(e))
        return Changed.NOTHING
    return _start(chat, pending)


def stop(chat: Chat) -> Changed:
    """Stop the reply being generated: it ends with what it has, saved as interrupted."""
    return Changed.GENERATION if chat.generation.stop() else Changed.NOTHING


# ------------------------------------------------------------------------------------- messages
def switch_variant(chat: Chat, message_id: int) -> Changed:
    """Make a sibling (a reply variant or an edit branch) the active one; a picked reply follows."""
    if not idle(chat, "Stop the current reply before switching variants"):
        return Changed.NOTHING
    chat.session.show_variant(message_id)
    chat.conversation.follow_variant(message_id)
    return Changed.STORE | Changed.CONVERSATION


def delete_message(chat: Chat, message_id: int) -> Changed:
    """Delete a message and everything below it."""
    if not idle(chat):
        return Changed.NOTHING
    chat.session.delete_message(message_id)
    chat.conversation.reload()
    chat.listing.refresh()
    return Changed.STORE | Changed.CONVERSATION | Changed.LIST


# ------------------------------------------------------------------------------------- conversations
def open_conversation(chat: Chat, conv_id: Optional[int]) -> Changed:
    """Show a conversation (None: a new, empty one, made by its first message). Each keeps its
    draft and the files attached to it; an earlier explanation is over."""
    if conv_id != chat.conversation.conv_id:
        chat.notices.tell("")
    chat.composer.switch(conv_id)
    chat.conversation.open(conv_id)
    return Changed.CONVERSATION | Changed.COMPOSER


def new_conversation(chat: Chat) -> Changed:
    """An empty chat (its row is made by its first message); it starts with an empty draft."""
    changed = open_conversation(chat, None)
    chat.composer.clear()
    return changed


def rename(chat: Chat, conv_id: int, title: str) -> Changed:
    chat.session.rename(conv_id, title)
    chat.listing.refresh()
    return Changed.STORE | Changed.LIST


def delete_conversation(chat: Chat, conv_id: int) -> Changed:
    """Delete a whole conversation (its draft goes with it), not while it is generating."""
    if not idle(chat, None, conv_id=conv_id):
        chat.notices.error("Cannot delete", "Stop the reply being generated in this conversation first.")
        return Changed.NOTHING
    chat.session.delete_conversation(conv_id)  # its draft goes with it (a trigger)
    chat.composer.drafts.forget(conv_id)
    changed = Changed.STORE | Changed.LIST
    if conv_id == chat.conversation.conv_id:
        changed |= open_conversation(chat, None)
    chat.listing.refresh()
    return changed


def import_conversation(chat: Chat, path: str, data: bytes) -> Changed:
    """Import a Verbatim JSON file (`data`, read from `path`) as a new conversation and show it;
    a file that is not one says why (a receipt says what it is and how to verify it)."""
    try:
        conv_id = chat.session.import_conversation(data)
    except StoreError as e:
        chat.notices.error("Import failed", import_error_text(path, data, str(e)))
        return Changed.NOTHING
    changed = Changed.STORE | open_conversation(chat, conv_id)
    chat.listing.refresh()
    return changed | Changed.LIST


def apply_settings(chat: Chat, settings: ChatSettings) -> Changed:
    """The open conversation's settings (a new chat has none yet: its first message makes it with
    the defaults, which the window keeps); the next prompt is counted again (the context limit or
    max tokens may have changed)."""
    save = chat.conversation.conv_id is not None and not chat.read_only
    chat.conversation.use_settings(settings, save=save)
    chat.composer.recount()
    return Changed.CONVERSATION | (Changed.STORE if save else Changed.NOTHING)
