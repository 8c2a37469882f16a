"""Why a file cannot be imported as a conversation, in the user's terms (no Qt).

The common mistake is a reply's receipt (the inspector's "Receipt" button, engine/receipts.py):
a JSON file too, but it holds one reply to replay, not a conversation. Say what it is and how
to use it instead of the store's generic "not a Verbatim conversation file".
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from engine.receipts import RECEIPT_FORMAT


def is_receipt(data: bytes) -> bool:
    try:
        doc = json.loads(data)
    except (ValueError, TypeError):
        return False
    return isinstance(doc, dict) and doc.get("format") == RECEIPT_FORMAT


def import_error_text(path: str, data: bytes, error: str) -> str:
    """The message for a failed import of `path` (its bytes `data`; `error`: the store's reason)."""
    if is_receipt(data):
        return (f"{Path(path).name} is a receipt of one reply, not a conversation: it is not imported. "
                "A receipt replays its reply to check that it is reproduced exactly:\n\n"
                f"    python -m engine verify {shlex.quote(path)}")
    return error
