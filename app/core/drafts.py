"""Each conversation's unsent text (no Qt): switching conversations keeps every draft where it
was typed; a new chat starts empty."""

from __future__ import annotations

from typing import Optional


class Drafts:
    def __init__(self) -> None:
        self._text: dict[Optional[int], str] = {}  # None: the new chat not saved yet

    def switch(self, old: Optional[int], text: str, new: Optional[int]) -> str:
        """Keep `text` as the draft of `old`; the draft of `new` (taken out: it is in the composer now)."""
        self.keep(old, text)
        return self._text.pop(new, "")

    def keep(self, conv_id: Optional[int], text: str) -> None:
        if text.strip():
            self._text[conv_id] = text
        else:
            self._text.pop(conv_id, None)

    def forget(self, conv_id: Optional[int]) -> None:
        self._text.pop(conv_id, None)

    def get(self, conv_id: Optional[int]) -> str:
        return self._text.get(conv_id, "")
