"""What the window does to whole conversations: rename, delete, export, import (each asks
what it must through app/qt/dialogs.py and tells its errors through the chat model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.core.engine_link import flows
from app.core.conversation.import_hint import import_error_text
from app.core.store import StoreError
from app.qt import dialogs

MainWindow = Any  # app/qt/window/window.py's (not imported: the window imports this module)


def ask_rename(w: "MainWindow", conv_id: int) -> None:
    title = dialogs.ask_title(w, w.session.title(conv_id))
    if title:
        rename(w, conv_id, title)


def rename(w: "MainWindow", conv_id: int, title: str) -> None:
    w.session.rename(conv_id, title)
    w.refresh_conversations()


def delete(w: "MainWindow", conv_id: int, confirm: bool = True) -> None:
    pending = w.chat.pending
    if pending is not None and pending.conversation_id == conv_id:
        w.show_error("Cannot delete", "Stop the reply being generated in this conversation first.")
        return
    if confirm and not dialogs.confirm(
        w, "Delete conversation", f"Delete “{w.session.title(conv_id)}” and all its replies?"
    ):
        return
    w.session.delete_conversation(conv_id)  # its draft goes with it (a trigger)
    w.drafts.forget(conv_id)
    if conv_id == w.conv_id:
        w.show_conversation(None)
    w.refresh_conversations()


def export(w: "MainWindow", conv_id: int) -> None:
    path = dialogs.export_path(w, w.session.title(conv_id), w.qsettings)
    if not path:
        return
    try:
        text = w.session.export(conv_id, as_json=path.endswith(".json"), model=flows.model_identity(w.chat))
        Path(path).write_text(text, encoding="utf-8")
    except (OSError, StoreError) as e:
        w.show_error("Export failed", str(e))
        return
    w.status(f"Exported to {path}", 4000)


def import_(w: "MainWindow") -> None:
    path = dialogs.import_path(w, w.qsettings)
    if not path:
        return
    try:
        data = Path(path).read_bytes()
        conv_id = w.session.import_conversation(data)
    except OSError as e:
        w.show_error("Import failed", str(e))
        return
    except StoreError as e:  # a receipt says what it is and how to verify it
        w.show_error("Import failed", import_error_text(path, data, str(e)))
        return
    w.show_conversation(conv_id)
    w.refresh_conversations()
