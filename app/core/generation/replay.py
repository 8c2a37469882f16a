"""A regenerate expected to repeat its reply, shown at once and verified as it is recomputed (no Qt).

Regenerate reuses the reply's own seed and settings; in exact mode, with the same model, it must
come out the same tokens with bit-equal logprobs. So the window shows the previous reply's text
the moment Regenerate is pressed, marked as being re-checked, and confirms it token by token as
the engine recomputes it ("verified 120 / 300"). The recomputation is the proof and always runs:
nothing is marked identical before the engine's last token agrees. Should it part from the shown
reply (a token, or a logprob not bit-equal), verifying stops there, the place is marked, and the
new text is shown from there on.

    expect(action, mode, model_key, previous) -> Replay | None   (when a repeat is expected)
    Replay.feed(index, token, logprob, text)                      (each streamed token, in order)
    Replay.end(tokens, logprobs, stopped)                         (the recomputation ended)

What is instant is the text (it is the stored reply) and the first token (the prompt cache
restores all but the prompt's last token: no prompt processing); the verification itself runs at
decode speed. A change the app cannot see before the run (the conversation's system prompt
edited since the reply) makes a regenerate part from the reply: the recomputation shows it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from app.core.store import Action, Message
from engine.types import first_divergence

# What Regenerate does, as its tooltips say it: what is instant and what is not.
REGENERATE_TIP = ("Same seed and settings: reproduces the reply (Ctrl+R). Instant: the reply is shown at once from "
                  "the previous run, and its first token comes with no prompt processing (the prompt cache). Not "
                  "instant: the engine recomputes every token at decode speed, and each is checked against the shown "
                  "reply (\"verified 120 / 300\"); where they part, the new text is shown from there on.")


@dataclass(frozen=True)
class Expected:
    """The reply a regenerate should repeat: its tokens, logprobs (bit for bit) and text."""

    reply_id: int
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str


@dataclass(frozen=True)
class Departure:
    """Where the recomputation parts from the shown reply: the first token index that differs
    (`kind` "token": another token; "logprob": the same token, a logprob not bit-equal;
    "shorter": it ended before the reply's end; "longer": it went on past it) and how many
    characters of the reply's text come before it (the text both share)."""

    index: int
    chars: int
    kind: str


@dataclass
class Replay:
    """One regenerate's verification against the reply it is expected to repeat."""

    expected: Expected
    verified: int = 0  # leading tokens recomputed equal (same id, bit-equal logprob)
    departure: Optional[Departure] = None
    text: str = ""  # the recomputed text so far (shown from the departure on)
    seen: int = 0  # tokens streamed so far
    ended: bool = False
    stopped: bool = False  # the user stopped the recomputation
    tokens: list[int] = field(default_factory=list)  # the recomputation's, as streamed
    logprobs: list[float] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.expected.tokens)

    @property
    def confirmed(self) -> bool:
        """Every token recomputed equal and the recomputation ended where the reply ends."""
        return self.ended and not self.stopped and self.departure is None and self.verified == self.total

    def feed(self, index: int, token: int, logprob: float, text: str) -> None:
        """One streamed token (`index` counts from 0; text released late for an index already
        seen only adds to the text). Verifies it against the reply while nothing parted."""
        before = len(self.text)
        self.text += text
        if index < self.seen:
            return
        self.seen = index + 1
        self.tokens.append(token)
        self.logprobs.append(logprob)
        if self.departure is not None:
            return
        e = self.expected
        parted = first_divergence(e.tokens, self.tokens, e.logprobs, self.logprobs, start=index, b_ended=False)
        if parted is not None:  # another token, a logprob not bit-equal, or past the reply's end
            self.departure = Departure(parted[0], before, parted[1])
        else:
            self.verified = index + 1

    def end(self, tokens: Sequence[int], logprobs: Sequence[float], stopped: bool) -> None:
        """The recomputation ended with these tokens and logprobs, the whole run (`stopped`: by the
        user, not at its end). The token a reply ends at (an end or turn token) is no text and
        streams no event, so the tokens past those streamed are verified here, as `feed` would."""
        for i in range(self.seen, len(tokens)):
            self.feed(i, tokens[i], logprobs[i], "")
        n = len(tokens)
        self.ended, self.stopped = True, stopped
        if self.departure is None and not stopped and n < self.total:  # ended before the reply's end
            parted = first_divergence(self.expected.tokens, self.tokens[:n], start=n)
            if parted is not None:
                self.departure = Departure(parted[0], len(self.text), parted[1])

    @property
    def shown_text(self) -> str:
        """The reply's text while it holds; after a departure, what they share and the new text."""
        return self.expected.text if self.departure is None else self.text

    @property
    def badge(self) -> str:
        """The message's badge while it is re-checked: 're-checking… verified 120 / 300'."""
        d = self.departure
        if d is not None:
            what = {"token": "another token", "logprob": "the same token, a logprob not bit-equal",
                    "shorter": "it ended there", "longer": "it went on past the reply's end"}[d.kind]
            return f"≠ parts from the previous reply at token {d.index} ({what}): the new text from there on"
        if self.stopped:
            return f"stopped: verified {self.verified} / {self.total}"
        if self.confirmed:
            return f"✓ verified {self.verified} / {self.total}"
        return f"re-checking… verified {self.verified} / {self.total}"

    @property
    def state(self) -> str:
        """The badge's style: 'checking' while it holds, 'diff' once parted, 'same' when confirmed,
        'info' when stopped before its end."""
        if self.departure is not None:
            return "diff"
        if self.stopped:
            return "info"
        return "same" if self.confirmed else "checking"


def expect(action: Action, mode: str, model_key: str, previous: Optional[Message]) -> Optional[Replay]:
    """A replay of `previous` when a regenerate is expected to repeat it: Regenerate (its own
    seed and settings), exact mode, a complete reply with its tokens and logprobs, made by the
    loaded model (the same key). None otherwise (a new variant, fast mode, a stopped reply,
    another model): then the reply streams as any other."""
    if action is not Action.REGENERATE or mode != "exact" or previous is None or previous.status != "complete":
        return None
    tokens, logprobs = list(previous.tokens or []), list(previous.logprobs or [])
    made_by = previous.model_key or (previous.report.model_key if previous.report is not None else "")
    if not tokens or len(logprobs) != len(tokens) or not model_key or made_by != model_key:
        return None
    expected = Expected(previous.id, tuple(tokens), tuple(logprobs), previous.content)
    return Replay(expected)
