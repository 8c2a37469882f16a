"""The chat operations: what the widgets do to the chat model (send, regenerate, new variant,
continue, edit, stop, switch variant, delete), each a function over a `ChatModel`
(app/core/chat.py): it checks it may run, changes the store through the session, and starts the
flow; it returns whether it did. The events the model tells are named here too, so a widget
needs one module: `from app.core import ops`, then `ops.send(chat, text)` and
`chat.subscribe(ops.PATH, ...)`.
"""

from __future__ import annotations

from typing import Optional

from app.core.chat import (
    BANNER,
    CONVERSATIONS,
    DRAFT,
    ERROR,
    FINISHED,
    LINK,
    NOT_SENT,
    NOTICE,
    PATH,
    PENDING,
    PREFILL,
    REPLAY,
    RETURNED,
    RUNS,
    SELECTED,
    STATS,
    STATUS,
    STREAM,
    ChatModel,
    hidden_note,
)
from app.core.generation.continuing import begin_continue
from app.core.store import StoreError

# The events a ChatModel tells (app/core/chat.py), named here so a widget imports one module.
EVENTS = (BANNER, CONVERSATIONS, DRAFT, ERROR, FINISHED, LINK, NOTICE, PATH, PENDING, PREFILL, REPLAY,
          RETURNED, RUNS, SELECTED, STATS, STATUS, STREAM)
__all__ = ["BANNER", "CONVERSATIONS", "DRAFT", "ERROR", "FINISHED", "LINK", "NOTICE", "PATH", "PENDING",
           "PREFILL", "REPLAY", "RETURNED", "RUNS", "SELECTED", "STATS", "STATUS", "STREAM", "EVENTS",
           "ChatModel", "hidden_note", "send", "regenerate", "continue_reply", "edit", "reachable", "stop",
           "switch_variant", "delete_message"]
# Each operation is a function over the model: it checks it may run, changes the store through
# the session, and starts the flow; it returns whether it did.


def send(chat: ChatModel, text: str) -> bool:
    """Send what the user typed (True if a reply started)."""
    if not text.strip() or chat.generating:
        return False
    if chat.read_only:
        chat.emit(ERROR, "Read-only", "Another Verbatim window owns this data folder.")
        return False
    if not reachable(chat):
        return False
    why = chat.refusal(text)
    if why:  # the meter counted this very text: nothing is saved, the draft stays
        chat.emit(STATUS, why, 8000)
        return False
    try:  # one transaction: the conversation (if new), the message, its files and the reply's row
        pending = chat.begin_send(text)
    except StoreError as e:
        chat.emit(ERROR, "Cannot save the message", str(e))
        return False
    chat._start(pending)
    return True


def regenerate(chat: ChatModel, fresh: bool = False) -> bool:
    """Regenerate the selected reply (its own seed and settings: it must come out the same) or,
    `fresh`, make a new variant of it (a fresh seed, the current settings). A trailing user message
    that has no reply (its generation failed) is answered instead, unless a reply was picked."""
    if chat.generating or chat.conv_id is None or chat.read_only or not reachable(chat):
        return False
    target = chat.selected
    try:
        if chat.vms and chat.vms[-1].role == "user" and (target is None or target.id != chat.selected_id):
            pending = chat.session.begin_reply_to(chat.vms[-1].id, chat.model_name)
        elif target is not None:
            pending = chat.session.begin_regenerate(target.id, fresh=fresh, model_name=chat.model_name)
            ids = [vm.id for vm in chat.vms]  # a middle reply: the turns after it stay with it
            pending.hidden = len(ids) - ids.index(target.id) - 1 if target.id in ids else 0
        else:
            return False
    except StoreError as e:
        chat.emit(ERROR, "Cannot regenerate", str(e))
        return False
    chat._start(pending)
    return True


def continue_reply(chat: ChatModel, reply_id: Optional[int] = None) -> bool:
    """Continue a reply that was stopped or ended at max tokens (the selected one by default), in
    place: with its own seed and settings it goes on as the reply that was never stopped."""
    if chat.generating or chat.conv_id is None or chat.read_only or not reachable(chat):
        return False
    rid = reply_id if reply_id is not None else chat.selected_id
    if rid is None:
        return False
    try:
        pending = begin_continue(chat.session, rid, chat.model_name)
    except StoreError as e:
        chat.emit(ERROR, "Cannot continue", str(e))
        return False
    chat._start(pending)
    return True


def edit(chat: ChatModel, user_id: int, text: str) -> bool:
    """Edit a user message as a branch and answer the edit."""
    if chat.generating or chat.read_only:
        chat.emit(STATUS, "Stop the current reply first", 3000)
        return False
    if not reachable(chat):
        return False
    try:
        pending = chat.session.begin_edit(user_id, text, chat.model_name)
    except StoreError as e:
        chat.emit(ERROR, "Cannot edit", str(e))
        return False
    chat._start(pending)
    return True



def reachable(chat: ChatModel) -> bool:
    """Whether a reply can start: not while the server the window is attached to is unreachable
    (nothing is sent, so nothing typed is lost; the status bar says why)."""
    link = chat.link
    if link is None or link.up:
        return True
    why = f"{NOT_SENT}{link.error or 'the server is not reachable'}. What you typed is kept."
    chat.emit(STATUS, why, 6000)
    chat.tell(why + " Send works again as soon as the server answers.")  # whole, where it stays
    return False


def stop(chat: ChatModel) -> bool:
    """Stop the reply being generated: it ends with what it has, saved as interrupted."""
    if chat.pending is None:
        return False
    chat._cancel.cancel()
    chat.emit(STATUS, "Stopping…", 2000)
    return True


def switch_variant(chat: ChatModel, message_id: int) -> bool:
    """Make a sibling (a reply variant or an edit branch) the active one; a picked reply follows."""
    if chat.generating:
        chat.emit(STATUS, "Stop the current reply before switching variants", 3000)
        return False
    chat.session.show_variant(message_id)
    chat.follow_variant(message_id)
    return True


def delete_message(chat: ChatModel, message_id: int) -> bool:
    """Delete a message and everything below it."""
    if chat.generating:
        chat.emit(STATUS, "Stop the current reply first", 3000)
        return False
    chat.session.delete_message(message_id)
    chat.reload()
    chat.emit(CONVERSATIONS)
    return True
