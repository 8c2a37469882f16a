"""One-line texts the window says outside a reply's report (that is app/core/conversation/view_models.py):
an error, and what a regenerate of a middle reply did to the turns after it."""

from __future__ import annotations

from app.core.store import StoreError
from engine.errors import VerbatimError


def user_message(e: BaseException) -> str:
    """One line for the window: the errors users cause carry their own message."""
    if isinstance(e, (VerbatimError, StoreError, OSError)):
        return str(e) or type(e).__name__
    return f"{type(e).__name__}: {e}"


def hidden_note(n: int) -> str:
    """What a regenerate or new variant of a middle reply did to the turns after it."""
    return (f"the {n} later message{'s' if n != 1 else ''} stay with the previous variant"
            " (‹ › on the reply shows them again)")
