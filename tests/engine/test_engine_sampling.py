"""Sampler truncation, seeded draws, streamed text deltas and stop conditions."""

from __future__ import annotations

import math

import mlx.core as mx
import pytest

from engine.generate.sampling import Sampler, _truncate
from engine.generate.templating import TextStream
from engine.types import GenerationRequest, SamplerSettings, TokenEvent
from tests.engine_helpers import make_engine, request


@pytest.fixture(scope="module")
def eng(llama):
    return make_engine(llama)


def kept(scores: mx.array) -> list[int]:
    return [i for i, v in enumerate(scores[0].tolist()) if v != -math.inf]


def test_truncation_top_k_top_p_min_p():
    probs = mx.array([[0.5, 0.25, 0.15, 0.07, 0.03]])
    logits = mx.log(probs)
    assert kept(_truncate(logits, 2, 1.0, 0.0)) == [0, 1]
    assert kept(_truncate(logits, 0, 0.7, 0.0)) == [0, 1]  # 0.5 < 0.7 so token 1 is needed too
    assert kept(_truncate(logits, 0, 0.5, 0.0)) == [0]
    assert kept(_truncate(logits, 0, 1.0, 0.3)) == [0, 1, 2]  # floor 0.15
    assert kept(_truncate(logits, 3, 0.9, 0.2)) == [0, 1, 2]
    assert kept(_truncate(logits, 0, 1.0, 0.0)) == [0, 1, 2, 3, 4]


def test_seeded_draws_reproduce_and_differ_by_seed():
    logits = mx.zeros((1, 50))

    def draws(seed):
        s = Sampler(SamplerSettings(temperature=1.0, seed=seed))
        return [int(s(logits)[0].item()) for _ in range(20)]

    assert draws(3) == draws(3)
    assert draws(3) != draws(4)


def test_greedy_picks_argmax_and_reports_its_logprob():
    logits = mx.array([[0.0, 2.0, 1.0]])
    tok, lp = Sampler(SamplerSettings())(logits)
    assert int(tok.item()) == 1
    expected = 2.0 - math.log(math.exp(0) + math.exp(2) + math.exp(1))
    assert lp.item() == pytest.approx(expected, abs=1e-6)


def test_repetition_penalty_lowers_repeated_tokens():
    logits = mx.array([[2.0, 1.9, -1.0]])
    s = Sampler(SamplerSettings(repetition_penalty=2.0))
    tok, _ = s(logits, mx.array([0]))
    assert int(tok.item()) == 1  # 2.0 / 2 = 1.0 < 1.9


def test_logit_bias_shifts_logits_before_sampling():
    probs = mx.array([[0.5, 0.25, 0.15, 0.07, 0.03]])
    logits = mx.log(probs)
    banned = Sampler(SamplerSettings(temperature=0.0, logit_bias={"0": -100}))
    token, logprob = banned(logits)
    assert int(token.item()) == 1  # the argmax is banned: the next best
    forced = Sampler(SamplerSettings(temperature=0.0, logit_bias={"4": 100}))
    assert int(forced(logits)[0].item()) == 4
    # Sampled: a banned token is never drawn, whatever the seed.
    for seed in range(20):
        s = Sampler(SamplerSettings(temperature=1.0, seed=seed, logit_bias={"0": -100, "1": -100}))
        assert all(int(s(logits)[0].item()) in (2, 3, 4) for _ in range(5))
    # The reported logprob is the biased distribution's (what was sampled from).
    biased = mx.log(mx.array([[0.5 * math.exp(-100), 0.25, 0.15, 0.07, 0.03]]))
    expected = (biased - mx.logsumexp(biased, axis=-1, keepdims=True))[0, 1].item()
    assert logprob.item() == pytest.approx(expected, rel=1e-5)


def test_logit_bias_settings_are_validated_and_round_trip():
    s = SamplerSettings(logit_bias={"7": -100, "3": 2.5})
    assert s.logit_bias == ((3, 2.5), (7, -100.0))
    assert s.to_dict()["logit_bias"] == {"3": 2.5, "7": -100.0}
    assert SamplerSettings.from_dict(s.to_dict()) == s
    assert "logit_bias" not in SamplerSettings().to_dict()  # settings stored before it read back the same
    for bad in ({"x": 1}, {"-1": 1}, {"1": 100.5}, {"1": float("nan")}, {"1": "5"}, [(1, 2, 3)]):
        with pytest.raises(ValueError):
            SamplerSettings(logit_bias=bad)


def test_a_token_id_past_the_vocabulary_is_refused_before_any_work(eng):
    from engine.errors import RequestError

    vocab = eng.lm.model.args.vocab_size
    with pytest.raises(RequestError, match="vocabulary"):
        eng.prepare(GenerationRequest([{"role": "user", "content": "hi"}], SamplerSettings(logit_bias={str(vocab): 1})))


def test_text_deltas_never_split_a_character(eng):
    tok = eng.lm.tokenizer
    text = "café 🙂 日本語 naïve"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) > len(text) // 2  # byte-level pieces: multi-byte chars span tokens
    stream = TextStream(tok, set())
    deltas = [stream.add(t) for t in ids] + [stream.flush()]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == tok.decode(ids) == text


def test_streamed_events_concatenate_to_text_and_stop_string(eng):
    msgs = [{"role": "user", "content": "Tell me about café and naïve señor."}]
    events = []
    full = eng.generate(request(msgs, max_tokens=30, temperature=1.0, seed=1), events.append)
    streamed = "".join(e.text for e in events if isinstance(e, TokenEvent))
    assert streamed == full.text and full.finish_reason == "length" and len(full.tokens) == 30
    assert len(full.text) > 6
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 3]
    events.clear()
    cut = eng.generate(GenerationRequest(msgs, SamplerSettings(max_tokens=30, temperature=1.0, seed=1), stop=(stop,)),
                       events.append)
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.find(stop)]
    assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == cut.text
    assert cut.tokens == full.tokens[: len(cut.tokens)]


def test_max_tokens_is_respected(eng):
    r = eng.generate(request([{"role": "user", "content": "hi"}], max_tokens=3))
    assert len(r.tokens) == 3 and r.finish_reason == "length"
