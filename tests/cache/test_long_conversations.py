"""Long conversations: exact mode reuses every earlier turn (message-boundary and reply header
cuts), earlier turns
regenerate instantly, fast -> exact never restores a non-canonical state, and the context policy."""

from __future__ import annotations

import dataclasses

import pytest

from engine.errors import ContextLengthError
from engine.generate.context import fit_to_context
from engine.generate.templating import Rendered
from engine.generate.loop import drain, stream
from engine.types import ContextInfo, GenerationRequest, SamplerSettings
from tests.engine_helpers import (
    ALL_FAMILIES,
    QUESTIONS,
    cold_request,
    make_engine,
    request,
    require_openblas,
)

FOLLOW_UPS = ["Why?", "Say more about the second point, please.", "And how does that compare with yesterday?"]


def _chat(eng, mode: str, turns: int, first: str = QUESTIONS[1], max_tokens: int = 12):
    """(request, result) per turn; each turn adds the reply and a follow-up."""
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": first}]
    out = []
    for t in range(turns):
        req = request(msgs, mode=mode, max_tokens=max_tokens)
        r = eng.generate(req)
        out.append((req, r))
        msgs = msgs + [{"role": "assistant", "content": r.text}, {"role": "user", "content": FOLLOW_UPS[t % 3]}]
    return out


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_exact_mode_reuses_every_earlier_turn_and_equals_cold(models, family):
    """C = 512 and prompts far shorter: only message-boundary and reply header cuts can make a
    follow-up warm."""
    require_openblas()
    eng = make_engine(models[family], chunk=512)
    cold_eng = make_engine(models[family], chunk=512)
    turns = _chat(eng, "exact", 4)
    for k in range(1, len(turns)):
        (_, prev), (req, r) = turns[k - 1], turns[k]
        grew = r.report.prompt_tokens - prev.report.prompt_tokens  # previous reply + new message + headers
        assert r.report.restored > 0, (family, k, r.report.declines)
        assert r.report.prefill_tokens <= grew + 16, (family, k, r.report.prefill_tokens, grew)
        # the previous turn's regenerate point: its prompt but the last token (a reply header
        # cut, where that turn's generation header ends), not a multiple of C
        assert r.report.restored == prev.report.prompt_tokens - 1 and r.report.restored in r.report.reply_header_cuts
        cold = cold_eng.generate(cold_request(req))
        assert cold.report.restored == 0
        assert r.tokens == cold.tokens and r.logprobs == cold.logprobs, (family, k)


def test_control_without_message_cuts_the_cold_run_differs(models):
    """The control arm: a cold run that does not cut at message boundaries forwards other widths,
    and with OpenBLAS its logprobs differ from the warm exact reply. So the test above can fail."""
    require_openblas()
    differ = 0
    total = 0
    for family in ALL_FAMILIES:
        eng = make_engine(models[family], chunk=512)
        for req, r in _chat(eng, "exact", 3)[1:]:
            p = eng.prepare(req)
            uncut = drain(stream(eng.lm, dataclasses.replace(p, request=dataclasses.replace(p.request, use_cache=False),
                                                             message_starts=[], reply_header_cuts=[]), None, eng.chunk))
            total += 1
            differ += uncut.tokens != r.tokens or uncut.logprobs != r.logprobs
    assert differ >= total // 2 + 1, f"only {differ}/{total} differed"


@pytest.mark.parametrize("mode", ["exact", "fast"])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_regenerating_an_earlier_turn_is_instant_and_identical(models, family, mode):
    eng = make_engine(models[family], chunk=512)
    turns = _chat(eng, mode, 3)
    req1, first = turns[0]
    again = eng.generate(req1)
    n = first.report.prompt_tokens
    assert again.report.restored == n - 1 and again.report.prefill_tokens == 1
    assert all(o in (None, n - 1) for o in again.report.layer_offsets)
    assert again.tokens == first.tokens and again.logprobs == first.logprobs


# Not gemma3: its wrapped window leaves fast mode only whole snapshots, all at exact points (the
# test below), so its fast turns are canonical and exact mode may restore them.
@pytest.mark.parametrize("family", [f for f in ALL_FAMILIES if f != "gemma3"])
def test_exact_after_fast_turns_never_restores_a_fast_state(models, family):
    require_openblas()
    eng = make_engine(models[family], chunk=512)
    turns = _chat(eng, "fast", 3)
    req3 = dataclasses.replace(turns[-1][0], mode="exact")
    exact = eng.generate(req3)
    cold = make_engine(models[family], chunk=512).generate(cold_request(req3))
    assert exact.tokens == cold.tokens and exact.logprobs == cold.logprobs
    # turn 2 ran in fast mode: nothing it computed is exact, so the restore lands at or before
    # the start of turn 1's reply (the last point computed by a canonical prefill)
    assert exact.report.restored <= turns[0][1].report.prompt_tokens
    fast3 = turns[-1][1]
    assert fast3.report.restored > exact.report.restored  # fast mode had reused more


def test_fast_mode_on_a_wrapped_window_restores_only_exact_points(models):
    """gemma3's sliding window has wrapped: a snapshot is usable only whole, and the one a fast
    follow-up finds is the previous turn's pre-last, at a reply header cut of its own prompt. So
    each fast turn restores exactly what exact mode would, and equals a cold run bit for bit."""
    require_openblas()
    eng = make_engine(models["gemma3"], chunk=512)
    cold_eng = make_engine(models["gemma3"], chunk=512)
    turns = _chat(eng, "fast", 3)
    for (_, prev), (req, r) in zip(turns, turns[1:]):
        assert r.report.restored == r.report.stored == prev.report.prompt_tokens - 1 and not r.report.partial
        assert r.report.restored in r.report.reply_header_cuts
        cold = cold_eng.generate(cold_request(req))
        assert (r.tokens, r.logprobs) == (cold.tokens, cold.logprobs)


# -- the context policy -------------------------------------------------------------------------

def _long_chat(n_turns: int) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": "Be brief."}]
    for t in range(n_turns):
        msgs += [{"role": "user", "content": f"Question {t}: " + QUESTIONS[t % len(QUESTIONS)]},
                 {"role": "assistant", "content": f"Answer {t}: it depends on the light and the air."}]
    return msgs + [{"role": "user", "content": "Last question: what is Rome?"}]


def test_a_conversation_past_the_context_is_refused_before_any_prefill(models):
    eng = make_engine(models["llama"], chunk=8, context_length=200)
    calls = []
    model = eng.lm.model
    eng.lm.model = lambda x, cache=None: calls.append(x.shape) or model(x, cache=cache)
    req = GenerationRequest(_long_chat(12), SamplerSettings(max_tokens=16))
    with pytest.raises(ContextLengthError, match=r"prompt has \d+ tokens, max tokens 16, the model's context is 200"):
        eng.generate(req)
    assert calls == [] and eng.cache.metas() == []  # nothing ran, nothing stored


def test_truncate_leaves_out_the_oldest_turns_and_regenerates_identically(models):
    eng = make_engine(models["llama"], chunk=8, context_length=200)
    msgs = _long_chat(12)
    req = GenerationRequest(msgs, SamplerSettings(max_tokens=16), context_policy="truncate")
    first = eng.generate(req)
    ctx = first.report.context
    assert ctx.limit == 200 and ctx.dropped_messages > 0 and ctx.dropped_messages % 2 == 0
    assert ctx.prompt_tokens + 16 <= 200 and ctx.prompt_tokens == first.report.prompt_tokens
    kept = [msgs[0]] + msgs[1 + ctx.dropped_messages:]
    assert first.report.prompt_tokens == len(eng.prompt_ids(kept))  # system + the newest turns
    again = eng.generate(req)
    assert again.report.restored == again.report.prompt_tokens - 1
    assert again.tokens == first.tokens and again.logprobs == first.logprobs
    # refuse when even the system prompt and the last message do not fit
    tiny = make_engine(models["llama"], chunk=8, context_length=30)
    with pytest.raises(ContextLengthError, match="even with only the system prompt and the last message"):
        tiny.generate(req)


def test_measure_counts_the_whole_prompt_against_the_limit_in_force(models):
    """What the context meter shows before Send: nothing left out, nothing refused, nothing run;
    the limit is the request's own (a per-conversation setting) when smaller than the model's."""
    eng = make_engine(models["llama"], chunk=8, context_length=200)
    msgs = _long_chat(12)
    req = GenerationRequest(msgs, SamplerSettings(max_tokens=16), context_policy="refuse")
    info = eng.measure(req)
    assert info.prompt_tokens == len(eng.prompt_ids(msgs)) > 200 and info.limit == 200
    assert info.dropped_messages == 0 and eng.cache.metas() == []
    assert eng.measure(dataclasses.replace(req, context_length=150)).limit == 150  # the smaller one wins
    assert eng.measure(dataclasses.replace(req, context_length=5000)).limit == 200  # never past the engine's
    raw = eng.measure(GenerationRequest([], prompt="raw text"))
    assert raw.prompt_tokens == len(eng.lm.tokenizer.encode("raw text"))


def test_fit_keeps_the_system_prompt_the_last_message_and_user_first():
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u1"},
            {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"},
            {"role": "assistant", "content": "a2"}, {"role": "user", "content": "u3"}]

    def render(m):
        return Rendered([0] * (10 * len(m)), None)

    fitted = fit_to_context(render, msgs, 5, 45, "truncate")  # 4 messages fit (40 + 5)
    assert [m["content"] for m in fitted.messages] == ["s", "u2", "a2", "u3"] and fitted.dropped == 2
    fitted = fit_to_context(render, msgs, 5, 35, "truncate")  # 3 would fit, but a reply cannot lead
    assert [m["content"] for m in fitted.messages] == ["s", "u3"] and fitted.dropped == 4
    assert fit_to_context(render, msgs, 5, 100, "refuse").dropped == 0


def test_decoding_stops_at_the_context_limit(models):
    eng = make_engine(models["llama"], chunk=8)
    req = request([{"role": "user", "content": QUESTIONS[0]}], max_tokens=50)
    p = eng.prepare(req)
    n = len(p.prompt)
    r = drain(stream(eng.lm, dataclasses.replace(p, request=dataclasses.replace(p.request, use_cache=False),
                                                 context=ContextInfo(n + 3, n)), None, 8))
    assert r.finish_reason == "context" and len(r.tokens) == 4  # positions n-1 .. n+2 < n + 3


def test_a_truncated_chat_keeps_its_prefix_and_its_cache_for_the_next_turns(models):
    """Left-out turns go in blocks of about a quarter of the context, so the next turns leave out
    the same ones: the prompt keeps its start and exact mode still reuses the cache."""
    require_openblas()
    eng = make_engine(models["llama"], chunk=512, context_length=400)
    cold_eng = make_engine(models["llama"], chunk=512, context_length=400)
    msgs = _long_chat(14)
    seen = []
    for t in range(5):
        req = GenerationRequest(msgs, SamplerSettings(max_tokens=8), context_policy="truncate")
        r = eng.generate(req)
        cold = cold_eng.generate(dataclasses.replace(req, use_cache=False))
        assert (r.tokens, r.logprobs) == (cold.tokens, cold.logprobs) and r.report.context == cold.report.context
        seen.append(r)
        msgs = msgs + [{"role": "assistant", "content": r.text}, {"role": "user", "content": f"Go on ({t})."}]
    dropped = [r.report.context.dropped_messages for r in seen]
    assert dropped[0] > 0 and dropped == sorted(dropped)
    same = [k for k in range(1, len(seen)) if dropped[k] == dropped[k - 1]]
    assert len(same) >= 3, dropped  # most follow-ups leave out the same messages...
    for k in same:  # ...and then reuse the cache up to the previous reply
        grew = seen[k].report.prompt_tokens - seen[k - 1].report.prompt_tokens
        assert seen[k].report.restored > 0 and seen[k].report.prefill_tokens <= grew + 16


def test_block_cuts_do_not_move_as_the_chat_grows():
    from engine.generate.context import _blocks

    def cuts(turns: int) -> list[int]:
        body = 2 * turns  # user, assistant, ...: a user turn starts at every even index
        return _blocks([k for k in range(2, body, 2)] + [body], [5] * body, 25)

    short, longer = cuts(10), cuts(30)
    assert short[:-1] == [6, 10, 16] and longer[: len(short) - 1] == short[:-1]
    assert all(b - a >= 4 for a, b in zip(longer, longer[1:-1]))  # whole blocks, not every turn


def test_a_request_may_use_less_context_than_the_model_never_more(models):
    eng = make_engine(models["llama"], chunk=8)
    model_limit = eng.info.context_length
    assert model_limit and model_limit > 200
    req = GenerationRequest(_long_chat(12), SamplerSettings(max_tokens=16), context_length=200)
    with pytest.raises(ContextLengthError, match="the model's context is 200$"):
        eng.generate(req)
    wide = eng.generate(dataclasses.replace(req, context_length=10 * model_limit))
    assert wide.report.context.limit == model_limit and wide.report.context.dropped_messages == 0
