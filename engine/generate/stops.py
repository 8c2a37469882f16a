"""Stop strings over a reply's growing text: where the first one starts, and how much of the
text may be handed out meanwhile.

A stop string can span tokens, so the text that could still be its start ("fa" while waiting
for "fa ") is held back until the next tokens show that it is not: the streamed text then
always concatenates to the final text, which ends before the first stop string. The engine does
this once for every consumer (CLI, window, server). The text searched is the settled text
(engine/generate/templating.py, TextStream): a byte sequence that decoded to U+FFFD and was
followed by more text is final and can be part of a stop string like any other character; at
the end the whole decoded text is searched once more (`find` with the flushed text), so a stop
string completed by the last, incomplete character still applies.
"""

from __future__ import annotations

from typing import Optional, Sequence


class StopStrings:
    """The stop strings of one generation, searched as its text grows (the text only grows)."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(dict.fromkeys(s for s in stops if s))
        self._searched = 0  # length of the text already searched: no stop string ends before it

    def find(self, text: str) -> Optional[int]:
        """Where the earliest stop string completed in `text` starts (None: none yet). Only the
        part a new occurrence can touch is searched: one ending before was found the last time."""
        hits = [i for s in self.stops if (i := text.find(s, max(0, self._searched - len(s) + 1))) >= 0]
        self._searched = len(text)
        return min(hits) if hits else None

    def held_back(self, text: str) -> int:
        """How many characters at the end of `text` could be the start of a stop string."""
        keep = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), keep, -1):
                if text.endswith(s[:n]):
                    keep = n
                    break
        return keep

    def shown(self, text: str) -> str:
        """The part of `text` that can be handed out: none of it can be part of a stop string."""
        return text[: len(text) - self.held_back(text)]
