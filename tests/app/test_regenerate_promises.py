"""Promises of a regenerate around the cache core, through the chat logic's public calls
(ChatSession) with a tiny real model: a regenerate repeats the reply's own mode whatever the
Settings say now, and "identical to an existing variant" needs bit-equal logprobs, not only
equal tokens (the window's side: tests/gui/test_regenerate.py)."""

from __future__ import annotations

import dataclasses

import pytest

from app.core.conversation.model import read_path
from app.core.store import ChatSettings
from engine.types import SamplerSettings
from tests.engine_helpers import flip_low_bit


def settings(mode: str) -> ChatSettings:
    return ChatSettings(sampler=SamplerSettings(temperature=0.9, max_tokens=12, seed=11), random_seed=False, mode=mode)


# -- mutation "identical variant decided on tokens alone" --------------------------------------------


def test_a_regenerate_with_equal_tokens_but_other_logprobs_is_kept_as_a_variant(session_engine) -> None:
    session, engine = session_engine
    conv = session.new_conversation(settings("exact"))
    p1 = session.begin_send(conv, "Why is the sky blue?")
    first = session.finish(p1, engine.generate(p1.request)).message
    p2 = session.begin_regenerate(first.id)
    result = engine.generate(p2.request)
    assert (result.tokens, result.logprobs) == (first.tokens, first.logprobs)  # the real regenerate: identical
    k = 3
    lps = list(result.logprobs)
    lps[k] = flip_low_bit(lps[k])  # the same tokens, one logprob one float32 ulp away
    saved = session.finish(p2, dataclasses.replace(result, logprobs=lps))
    reply = saved.message
    assert saved.duplicate_of is None and reply.id != first.id
    stored = session.store.get_message(reply.id)
    assert stored.tokens == first.tokens and stored.logprobs == lps and stored.status == "complete"
    assert saved.outcome.comparison.identical is False and saved.outcome.comparison.first_diff is None
    assert [m.id for m in session.store.siblings(first.id)] == [first.id, reply.id]
    assert read_path(session, conv)[-1].navigator == "2 / 2"


# -- mutation "regenerate uses the Settings' mode" -------------------------------------------------


@pytest.mark.parametrize("made, now", [("exact", "fast"), ("fast", "exact")])
def test_regenerate_repeats_the_replys_mode_whatever_the_settings_say(session_engine, made: str, now: str) -> None:
    session, engine = session_engine
    conv = session.new_conversation(settings(made))
    p1 = session.begin_send(conv, "The capital of France is")
    first = session.finish(p1, engine.generate(p1.request)).message
    assert first.report.mode == made
    session.set_settings(conv, settings(now))
    pending = session.begin_regenerate(first.id)
    assert pending.request.mode == made
    result = engine.generate(pending.request)
    assert result.report.mode == made and result.tokens == first.tokens
    variant = session.begin_regenerate(first.id, fresh=True)  # a new variant takes the Settings as they are
    assert variant.request.mode == now
