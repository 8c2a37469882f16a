"""The inspector without Qt: badge rules in the session (regenerate vs new variant vs a stopped
source, no duplicate variants), the compare data and its wording, receipts of stored replies."""

from __future__ import annotations

import json


from app.core.conversation.compare import Side, compare
from app.core.conversation.model import read_path
from app.core.store import ChatSettings
from app.core.store.session import ModelIdentity
from app.core.store import ReplyOutcome
from app.core.conversation.view_models import (
    FAST_NOTE,
    badge_state,
    compare_verdict,
    identity_text,
    prefix_text,
    side_text,
)
from engine import receipts
from engine.types import CancelToken, Comparison, SamplerSettings, TokenEvent


def settings(**kw) -> ChatSettings:
    return ChatSettings(sampler=SamplerSettings(temperature=0.9, top_p=0.95, max_tokens=16, seed=7), random_seed=False, **kw)


def run(session, engine, pending, stop_after=None):
    cancel = CancelToken()

    def on_event(e):
        if stop_after is not None and isinstance(e, TokenEvent) and e.index + 1 >= stop_after:
            cancel.cancel()

    return session.finish(pending, engine.generate(pending.request, on_event, cancel))


def test_regenerate_of_a_stopped_reply_is_compared_over_its_length(session_engine) -> None:
    session, engine = session_engine
    conv = session.new_conversation(settings())
    stopped = run(session, engine, session.begin_send(conv, "Why is the sky blue?"), stop_after=5).message
    assert stopped.status == "interrupted" and len(stopped.tokens) == 5
    p = session.begin_regenerate(stopped.id)
    saved = run(session, engine, p)
    again = saved.message
    assert again.id != stopped.id and saved.duplicate_of is None  # a complete reply is new, not a copy
    assert again.tokens[:5] == stopped.tokens and len(again.tokens) > 5
    c = again.outcome.comparison
    assert c.identical and c.upto == 5
    vm = read_path(session, conv)[-1]
    assert vm.identity == "identical up to where the first one stopped" and vm.badge_state == "same"
    assert identity_text(again.outcome, long=True) == "identical up to where the first one stopped (5 tokens)"
    assert ReplyOutcome.from_dict(again.cache_report).comparison.upto == 5  # stored


def test_new_variant_is_not_marked_differs_and_duplicates_are_not_added(session_engine) -> None:
    session, engine = session_engine
    conv = session.new_conversation(settings())
    first = run(session, engine, session.begin_send(conv, "The capital of France is")).message
    variant = run(session, engine, session.begin_regenerate(first.id, fresh=True)).message
    assert variant.tokens != first.tokens and variant.outcome.comparison is None
    vm = read_path(session, conv)[-1]
    assert (vm.identity, vm.badge, vm.badge_state, vm.navigator) == ("new seed", "new seed", "info", "2 / 2")
    # Regenerating either variant reproduces it: nothing is added, the variant is made active.
    for target in (first, variant):
        p = session.begin_regenerate(target.id)
        saved = run(session, engine, p)
        kept = saved.message
        assert kept.id == target.id and saved.duplicate_of == target.id and saved.outcome.comparison.identical
        assert [vm.id for vm in read_path(session, conv)][-1] == target.id
        assert read_path(session, conv)[-1].navigator.endswith("/ 2")
        assert identity_text(saved.outcome) == "identical to an existing variant (not added again)"


def test_wording_of_badges_and_verdicts() -> None:
    fast = ReplyOutcome("regenerate", 1, Comparison(False, None, 5.72e-06))
    assert identity_text(fast, long=True, mode="fast") == f"same tokens, logprobs differ by up to 5.72e-06 ({FAST_NOTE})"
    assert identity_text(fast, mode="fast") == "same tokens, logprobs differ by 5.72e-06 (fast mode)"
    assert badge_state(fast) == "near" and badge_state(ReplyOutcome("regenerate", 1, Comparison(False, 3))) == "diff"
    assert identity_text(ReplyOutcome("variant", 1)) == "new seed"
    a, b = [1, 2, 3, 4, 5], [1, 2, 3, 9, 9, 9]
    c = Comparison.of(a, [-0.5] * 5, b, [-0.5, -0.5, -0.25, -1.0, -1.0, -1.0], "abcde", "abcxyz")
    assert compare_verdict(c) == "diverge at token 3"
    assert prefix_text(c).startswith("shared prefix: 3 tokens, 3 characters")
    same = Comparison.of(a, [-0.5] * 5, a, [-0.5] * 4 + [-0.6])
    assert compare_verdict(same, ("fast", "fast")).endswith(f"({FAST_NOTE})")
    assert compare_verdict(Comparison.of(a, [0.0] * 5, a, [0.0] * 5)) == "identical (5 tokens, bit-equal logprobs)"
    assert compare_verdict(Comparison.of(a[:3], [0.0] * 3, a, [0.0] * 5)).startswith("diverge at token 3: the first ends there")


def test_compare_data_rows_and_plot_series() -> None:
    a = Side("A", [1, 2, 3], [-0.1, -0.2, -0.3], "xyz", ["x", "y", "z"], seed=1)
    b = Side("B", [1, 2, 4, 5], [-0.1, -0.25, -0.3, -2.0], "xyw!", None, seed=2, source="memory", restored=9,
             prompt_tokens=10)
    d = compare(a, b)
    assert d.rows == 4 and d.comparison.first_diff == 2 and d.comparison.shared_chars == 2
    assert d.row(0).same and not d.row(2).same and d.row(3).a is None and d.row(3).b == (5, "#5", -2.0)
    assert d.deltas() == [0.0, abs(-0.2 - -0.25), 0.0] and d.logprob_range() == (-2.0, -0.1)
    assert "cache: memory 9 / 10" in side_text(b) and "seed 1" in side_text(a)


def test_receipt_of_a_stored_reply_replays_and_rides_in_the_export(session_engine, tiny_model, tmp_path) -> None:
    session, engine = session_engine
    conv = session.new_conversation(settings())
    reply = run(session, engine, session.begin_send(conv, "Why is the sky blue?")).message
    model = ModelIdentity(str(tiny_model), engine.info.key, engine.info.name, engine.info.dequantized)
    receipt = session.receipt(reply.id, model)
    assert receipt.tokens == reply.tokens and receipt.model.spec == str(tiny_model)
    verdict = receipts.replay(receipts.loads(receipt.to_json()), engine, use_cache=False)
    assert verdict.ok, verdict.line()
    # Another model loaded: the receipt names no spec (verify then needs --model).
    assert session.receipt(reply.id, ModelIdentity("elsewhere", "otherkey")).model.spec == ""
    doc = json.loads(session.export(conv, as_json=True, model=model))
    exported = [m for m in doc["messages"] if m["role"] == "assistant"]
    assert exported[0]["receipt"]["tokens"] == reply.tokens
    again = session.import_conversation(json.dumps(doc).encode())  # still importable
    assert [m.content for m in session.store.active_path(again)] == [m.content for m in session.store.active_path(conv)]
