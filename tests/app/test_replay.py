"""The replay of a regenerate expected to repeat its reply (app/core/generation/replay.py, no Qt): which
regenerates expect a repeat, the count verified as tokens arrive, and where a recomputation that
does not repeat parts from the reply shown, driven by token streams that differ from it."""

from __future__ import annotations

import time
from typing import Optional

import pytest

from app.core.generation.replay import Replay, expect
from app.core.store import Action, Message

TOKENS = [11, 12, 13, 14, 15]
LOGPROBS = [-0.5, -1.25, -0.125, -2.0, -0.75]
PIECES = ["Hello", ",", " sea", " and", " sky"]


def reply(status: str = "complete", model_key: Optional[str] = "m1", tokens: Optional[list[int]] = None) -> Message:
    return Message(7, 1, 6, "assistant", "".join(PIECES), time.time(), status=status, seed=3,
                   model_key=model_key, tokens=list(TOKENS if tokens is None else tokens), logprobs=list(LOGPROBS))


def replayed(tokens: list[int], logprobs: list[float], pieces: list[str], stopped: bool = False) -> Replay:
    r = expect(Action.REGENERATE, "exact", "m1", reply())
    assert r is not None
    for i, (t, lp, text) in enumerate(zip(tokens, logprobs, pieces)):
        r.feed(i, t, lp, text)
    r.end(tokens, logprobs, stopped)
    return r


def test_only_a_regenerate_of_a_complete_exact_reply_by_the_loaded_model_expects_a_repeat() -> None:
    r = expect(Action.REGENERATE, "exact", "m1", reply())
    assert r is not None and r.expected.tokens == tuple(TOKENS) and r.expected.text == "Hello, sea and sky"
    assert (r.verified, r.total, r.state) == (0, 5, "checking") and r.badge == "re-checking… verified 0 / 5"
    assert r.shown_text == "Hello, sea and sky"  # the previous reply's text, before any token
    assert expect(Action.VARIANT, "exact", "m1", reply()) is None  # a fresh seed: nothing to repeat
    assert expect(Action.REGENERATE, "fast", "m1", reply()) is None  # fast mode: not promised bit-equal
    assert expect(Action.REGENERATE, "exact", "m2", reply()) is None  # another model
    assert expect(Action.REGENERATE, "exact", "m1", reply(model_key=None)) is None  # made by an unknown one
    assert expect(Action.REGENERATE, "exact", "m1", reply(status="interrupted")) is None  # stopped: goes on past it
    assert expect(Action.REGENERATE, "exact", "m1", reply(tokens=[])) is None
    assert expect(Action.REGENERATE, "exact", "m1", None) is None


def test_a_repeat_is_verified_token_by_token_and_confirmed_only_at_its_end() -> None:
    r = expect(Action.REGENERATE, "exact", "m1", reply())
    assert r is not None
    counts = []
    for i in range(5):
        r.feed(i, TOKENS[i], LOGPROBS[i], PIECES[i])
        counts.append(r.verified)
        assert not r.confirmed and r.badge == f"re-checking… verified {i + 1} / 5"
    assert counts == [1, 2, 3, 4, 5]
    r.end(TOKENS, LOGPROBS, stopped=False)
    assert r.confirmed and r.state == "same" and r.badge == "✓ verified 5 / 5" and r.departure is None


def test_the_token_a_reply_ends_at_is_verified_at_the_end_though_it_streamed_no_event() -> None:
    """A reply that ends at an end or turn token streams no event for that token (it is no
    text): the recomputation's whole tokens, handed over at its end, verify it, so a repeat of
    such a reply is confirmed, and one whose end token differs parts there."""
    r = expect(Action.REGENERATE, "exact", "m1", reply())
    assert r is not None
    for i in range(4):
        r.feed(i, TOKENS[i], LOGPROBS[i], PIECES[i])
    assert r.verified == 4 and not r.confirmed
    r.end(TOKENS, LOGPROBS, stopped=False)
    assert r.confirmed and r.badge == "✓ verified 5 / 5" and r.shown_text == "Hello, sea and sky"
    other = expect(Action.REGENERATE, "exact", "m1", reply())
    assert other is not None
    for i in range(4):
        other.feed(i, TOKENS[i], LOGPROBS[i], PIECES[i])
    other.end(TOKENS[:4] + [99], LOGPROBS, stopped=False)
    assert other.departure is not None and (other.departure.index, other.departure.kind) == (4, "token")


@pytest.mark.parametrize("at", [0, 2, 4])
def test_another_token_parts_there_and_the_new_text_shows_from_there(at: int) -> None:
    tokens = TOKENS[:at] + [99] + TOKENS[at + 1:]
    pieces = PIECES[:at] + [" storm"] + PIECES[at + 1:]
    r = replayed(tokens, LOGPROBS, pieces)
    d = r.departure
    assert d is not None and (d.index, d.kind) == (at, "token") and r.verified == at
    assert d.chars == len("".join(PIECES[:at]))  # the text both share ends where the token parts
    assert r.shown_text == "".join(pieces) and r.shown_text[d.chars:].startswith(" storm")
    assert not r.confirmed and r.state == "diff" and f"parts from the previous reply at token {at}" in r.badge


def test_a_logprob_not_bit_equal_parts_as_well() -> None:
    logprobs = list(LOGPROBS)
    logprobs[3] = LOGPROBS[3] + 2**-40  # the same token, one ulp-ish away: not the same run
    r = replayed(TOKENS, logprobs, PIECES)
    assert r.departure is not None and (r.departure.index, r.departure.kind) == (3, "logprob")
    assert r.verified == 3 and not r.confirmed and "logprob not bit-equal" in r.badge


def test_shorter_and_longer_recomputations_part_at_the_reply_end() -> None:
    short = replayed(TOKENS[:3], LOGPROBS[:3], PIECES[:3])
    assert short.departure is not None and (short.departure.index, short.departure.kind) == (3, "shorter")
    assert short.verified == 3 and not short.confirmed
    long = replayed(TOKENS + [16], LOGPROBS + [-1.0], PIECES + ["!"])
    assert long.departure is not None and (long.departure.index, long.departure.kind) == (5, "longer")
    assert long.verified == 5 and not long.confirmed and long.shown_text.endswith("sky!")


def test_a_stopped_recomputation_is_not_confirmed() -> None:
    r = replayed(TOKENS[:2], LOGPROBS[:2], PIECES[:2], stopped=True)
    assert r.departure is None and not r.confirmed and r.badge == "stopped: verified 2 / 5"
