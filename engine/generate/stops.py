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

Stop strings apply to free text only (docs/tools-and-formats.md): never inside a tool call or a
constrained value, which a stop string would cut into markup that is neither text nor a call.
A reply decoded under a grammar (a forced tool call, a JSON response format) is constrained from
its first token to its last, so it has no free text (`reply_stops`: no stop strings). A reply
that may call tools as it likes (tool_choice "auto", no grammar) is free text except its calls:
each call runs from the model's tool-call start marker through its end marker (or to the end of
the reply, while unclosed), and a stop string is searched only between calls, wholly inside one
stretch of free text. Text at the end that could still be the start of a call's marker is not
searched yet, and is held back like a stop string's possible start.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from engine.types import GenerationRequest


class StopStrings:
    """The stop strings of one generation, searched as its text grows (the text only grows).
    `calls`: the tool-call (start, end) markers whose spans are not free text (None: all of
    the text is free)."""

    def __init__(self, stops: Sequence[str], calls: Optional[tuple[str, str]] = None) -> None:
        self.stops = tuple(dict.fromkeys(s for s in stops if s))
        self.calls = calls if calls is not None and calls[0] and calls[1] else None
        self._pos = 0  # where the unsettled part starts: the current free stretch, or the open call
        self._in_call = False  # the text from _pos on is inside a call (its end marker not yet seen)
        self._searched = 0  # length of the text already searched: no stop string ends before it

    def find(self, text: str, final: bool = False) -> Optional[int]:
        """Where the earliest stop string completed in the free text of `text` starts (None:
        none yet). Only the part a new occurrence can touch is searched: one ending before was
        found the last time. `final`: the reply ended, so its last characters are no marker's
        possible start."""
        if not self.stops:
            return None
        while True:
            if self._in_call:
                assert self.calls is not None
                k = text.find(self.calls[1], self._pos)
                if k < 0:
                    return None
                self._pos = self._searched = k + len(self.calls[1])
                self._in_call = False
                continue
            j = text.find(self.calls[0], self._pos) if self.calls is not None else -1
            end = j if j >= 0 else len(text) - (0 if final else self._marker_start(text))
            hits = [i for s in self.stops
                    if (i := text.find(s, max(self._pos, self._searched - len(s) + 1), end)) >= 0]
            self._searched = max(self._searched, end)
            if hits:
                return min(hits)
            if j < 0:
                return None
            assert self.calls is not None
            self._in_call, self._pos = True, j + len(self.calls[0])

    def _marker_start(self, text: str) -> int:
        """How many characters at the end of `text` could be the start of a call's marker."""
        if self.calls is None:
            return 0
        marker = self.calls[0]
        return next((n for n in range(min(len(marker) - 1, len(text) - self._pos), 0, -1)
                     if text.endswith(marker[:n])), 0)

    def held_back(self, text: str) -> int:
        """How many characters at the end of `text` could be the start of a stop string (or, in
        free text, of a call's marker, which decides whether a stop string there counts). Call
        `find` first: inside a call nothing is held back."""
        if not self.stops or self._in_call:
            return 0
        free = len(text) - self._pos
        keep = self._marker_start(text)
        for s in self.stops:
            for n in range(min(len(s) - 1, free), keep, -1):
                if text.endswith(s[:n]):
                    keep = n
                    break
        return keep

    def shown(self, text: str) -> str:
        """The part of `text` that can be handed out: none of it can be part of a stop string."""
        return text[: len(text) - self.held_back(text)]


def reply_stops(request: GenerationRequest, tokenizer: Any, constrained: bool) -> StopStrings:
    """The stop strings of `request`'s reply where they apply: nowhere under a grammar
    (`constrained`), outside its tool calls when the model may call tools as it likes."""
    if constrained:
        return StopStrings(())
    c = request.constraint
    calls = None
    if c is not None and c.calls_parsed and getattr(tokenizer, "has_tool_calling", False):
        calls = (tokenizer.tool_call_start, tokenizer.tool_call_end)
    return StopStrings(request.stop, calls)
