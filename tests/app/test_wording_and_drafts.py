"""The Qt-free parts behind what the window shows before and during a reply: the prefill rate
(on a stepped clock, no sleeps), the context budget's wording, safe export names, drafts per
conversation, and the import error for a receipt."""

from __future__ import annotations

import json

from app.core.composer.context_budget import ContextBudget, budget_requests
from app.core.composer.drafts import Drafts
from app.core.conversation.filenames import safe_filename
from app.core.conversation.import_hint import import_error_text
from app.core.generation.prefill_rate import PrefillRate, time_left_text
from app.core.store import ChatSettings
from app.core.conversation.view_models import MessageVM
from engine.receipts import RECEIPT_FORMAT
from engine.types import SamplerSettings


class SteppedClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_prefill_rate_and_time_left_on_a_stepped_clock() -> None:
    clock = SteppedClock()
    rate = PrefillRate(clock=clock)
    # No rate from one event; but what is under way is said (a chunk can take seconds).
    assert rate.update(0, 6517) == "Reading the prompt: 0 / 6,517 · the first chunk is being read (rate and time left after it)"
    clock.now += 170.0
    line = rate.update(4608, 6517)  # 4608 tokens in 170 s: 27.1 tok/s, 1909 left: 70 s
    assert line == "Reading the prompt: 4,608 / 6,517 · 27 tok/s · about 1 min left"
    assert rate.tps == 4608 / 170 and rate.seconds_left == 1909 / (4608 / 170)
    clock.now += 70.0
    assert rate.update(6517, 6517) == "Reading the prompt: 6,517 / 6,517 · 27 tok/s"  # done: no time left


def test_prefill_rate_counts_only_what_is_read_and_restarts_on_a_new_prefill() -> None:
    clock = SteppedClock()
    rate = PrefillRate(clock=clock)
    rate.update(4000, 5000)  # 4000 restored from the cache: not read at any rate
    clock.now += 2.0
    assert rate.update(4010, 5000) == "Reading the prompt: 4,010 / 5,000 · 5.0 tok/s · about 3 min left"
    clock.now += 1.0
    assert rate.update(0, 300).startswith("Reading the prompt: 0 / 300 · the first chunk")  # a new prefill: the rate starts over
    assert rate.tps is None


def test_time_left_wording() -> None:
    assert [time_left_text(s) for s in (0.2, 41.3, 89, 3000, 3900)] == [
        "about 1 s left", "about 42 s left", "about 1 min left", "about 50 min left", "about 1 h 5 min left"]


def test_safe_filename() -> None:
    assert safe_filename("Why is the sky blue?") == "Why is the sky blue.md"
    assert safe_filename("a/b\\c: d*e?\"f\"<g>|h", ".json") == "a b c d e f g h.json"
    for title in ("", ".", "..", "?", "  . ", "///"):
        assert safe_filename(title) == "conversation.md", title
    assert safe_filename("CON") == "conversation CON.md"  # a reserved name on Windows
    assert safe_filename("tab\tand\nnewline") == "tab and newline.md"
    long = safe_filename("x" * 500)
    assert long == "x" * 80 + ".md"
    assert safe_filename("café — 東京") == "café — 東京.md"  # letters stay


def test_drafts_belong_to_their_conversation() -> None:
    d = Drafts()
    assert d.switch(None, "new chat text", 1) == ""
    assert d.switch(1, "draft for one", 2) == ""
    assert d.switch(2, "draft for two", 1) == "draft for one"
    assert d.switch(1, "draft for one, longer", None) == "new chat text"
    assert d.get(1) == "draft for one, longer" and d.get(2) == "draft for two"
    d.keep(2, "   ")  # blank: nothing to keep
    assert d.get(2) == ""
    d.forget(1)
    assert d.switch(None, "", 1) == ""


def _vm(i: int, role: str, content: str, status: str = "complete") -> MessageVM:
    return MessageVM(id=i, role=role, content=content, status=status, variant=1, variants=1, prev_id=None, next_id=None)


def test_budget_requests_count_the_path_and_the_draft_with_the_limit_in_force() -> None:
    s = ChatSettings(sampler=SamplerSettings(max_tokens=64), system_prompt="Be brief.", context_length=2048)
    vms = [_vm(1, "user", "hi"), _vm(2, "assistant", "hello"), _vm(3, "assistant", "", status="generating")]
    what = budget_requests(vms, "and now?", s)
    assert what is not None
    assert what.full.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                                  {"role": "assistant", "content": "hello"}, {"role": "user", "content": "and now?"}]
    assert what.alone is not None and what.alone.messages == [what.full.messages[0], what.full.messages[-1]]
    assert what.full.context_length == 2048 and what.max_tokens == 64 and what.policy == "truncate"
    assert budget_requests(vms, "  ", s).alone is None  # type: ignore[union-attr]
    assert budget_requests([], "", ChatSettings()) is None


def test_context_budget_wording() -> None:
    fits = ContextBudget(used=6920, limit=8192, max_tokens=512, draft=40)
    assert fits.fits and fits.text == "6,920 / 8,192" and fits.warning == ""
    assert ContextBudget(used=13473, limit=None, max_tokens=512).text == "13.5k"
    left_out = ContextBudget(used=13473, limit=2048, max_tokens=512, policy="truncate", draft=60)
    assert not left_out.fits and left_out.text == "13.5k / 2,048"
    assert left_out.warning == ("Will not fit: 13,473 tokens + up to 512 for the reply > the 2,048-token context."
                                " Send will leave the oldest turns out of the prompt.")
    refused = ContextBudget(used=13473, limit=2048, max_tokens=512, policy="refuse", draft=60)
    assert "Send will be refused" in refused.warning and "policy is refuse" in refused.warning
    alone = ContextBudget(used=13473, limit=2048, max_tokens=512, policy="truncate", draft=1800)
    assert alone.warning.startswith("Too long: this message alone needs 1,800 tokens") and "refused" in alone.warning
    assert ContextBudget(used=13473, limit=2048, max_tokens=512).warning == ""  # no draft: nothing to warn about


def test_a_receipt_is_named_when_imported_as_a_conversation() -> None:
    receipt = json.dumps({"format": RECEIPT_FORMAT, "version": 1, "tokens": [1, 2]}).encode()
    text = import_error_text("/tmp/my reply.receipt.json", receipt, "Not a Verbatim conversation file: ...")
    assert "my reply.receipt.json is a receipt of one reply, not a conversation" in text
    assert "python -m engine verify '/tmp/my reply.receipt.json'" in text
    assert import_error_text("x.json", b"{not json", "invalid JSON") == "invalid JSON"
