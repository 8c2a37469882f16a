"""Reply header cuts (issue 27): the canonical schedule also cuts, for every earlier reply, where
that turn's own prompt ended but its last token (G_i - 1), so a later turn forwards the reply's
generation header as the very chunk that turn did: its regenerate point is shared bit for bit,
in memory and on disk (one chain of blocks for the whole chat).

Real tiny models, real files; the expected cuts come from the earlier turns' own prompts, the
forwards from the model (tests/engine_helpers.py: forwards)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from transformers import AutoTokenizer

from engine.cache.planner import schedule_cuts
from engine.engine import Engine
from engine.generate.loop import drain, stream
from engine.generate.templating import MessageStarts, render_prompt
from tests.engine_helpers import (
    chat_turns,
    cold_request,
    forwards,
    make_engine,
    request,
    require_openblas,
)
from tests.tiny_models import build_tokenizer

FOLLOW_UPS = ["Why?", "Say more about the second point, please.", "And how does that compare with yesterday?"]
QUESTIONS = ["Why is the sky blue?", "Explain how a prompt cache works in two sentences.", "def add(a, b):",
             "Tell me about café and naïve señor.", "The capital of France is"]


pytestmark = pytest.mark.usefixtures("hash_memo_in_basetemp")


def _chat(eng, turns: int, first: str = QUESTIONS[0], logs=None):
    """[(request, result)] per turn of one exact-mode chat; with `logs`, each turn's forwards."""
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": first}]
    return chat_turns(eng, msgs, lambda t: FOLLOW_UPS[t % 3], turns, logs=logs)


def test_the_schedule_cuts_where_each_earlier_turns_prompt_ended_but_its_last_token(models):
    """Turn 3's reply header cuts are turn 1's and turn 2's prompt lengths minus one; they are
    cuts of its schedule (not message starts), and its cold run forwards each earlier header as
    exactly the chunk that earlier turn forwarded (seen at the model)."""
    eng = make_engine(models["llama"], chunk=512)  # prompts far shorter: no multiple of C cuts
    turns = _chat(eng, 3)
    (_, t1), (_, t2), (req3, t3) = turns
    expected = [len(t1.prompt_ids) - 1, len(t2.prompt_ids) - 1]
    p = eng.prepare(req3)
    assert p.reply_header_cuts == expected
    assert not set(expected) & set(p.message_starts)
    assert set(expected) <= set(schedule_cuts(len(p.prompt), 512, p.message_starts, p.reply_header_cuts))
    assert t3.report.reply_header_cuts == expected and t2.report.reply_header_cuts == expected[:1]
    assert t1.report.reply_header_cuts == []
    # Each turn's own last prefill chunk (its generation header but the last token), cold...
    cold_eng = make_engine(models["llama"], chunk=512)
    headers, cold_logs = [], []
    for req, r in turns:
        with forwards(cold_eng) as log:
            cold_eng.generate(cold_request(req))
        cold_logs.append(log)
        n = len(r.prompt_ids)
        i = log.spans.index((n - 1, n))  # the last prompt token, alone
        assert log.spans[i - 1][1] == n - 1
        headers.append(log.spans[i - 1])
    # ... is a forward of every later turn's cold run too, the same start and the same width.
    assert headers[0] in cold_logs[1].spans and headers[0] in cold_logs[2].spans
    assert headers[1] in cold_logs[2].spans


def test_reply_header_cuts_only_where_the_turns_prompt_is_a_prefix(tmp_path):
    """A template whose generation prompt is not how it renders a reply in the history (here it
    opens an empty think block that the history leaves out) gives no reply header cut; the same
    chat under the plain template does, one per assistant message."""
    plain, thinking = tmp_path / "plain", tmp_path / "thinking"
    plain.mkdir()
    thinking.mkdir()
    build_tokenizer(plain)
    build_tokenizer(thinking, "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
                              "{{ message['content'] }}<|im_end|>\n{% endfor %}"
                              "{% if add_generation_prompt %}<|im_start|>assistant\n<think></think>{% endif %}")
    msgs = [{"role": "user", "content": "Why is the sky blue?"}, {"role": "assistant", "content": "Rayleigh."},
            {"role": "user", "content": "Why?"}, {"role": "assistant", "content": "Scattering."},
            {"role": "user", "content": "And then?"}]
    for folder, want in ((plain, 2), (thinking, 0)):
        tok = AutoTokenizer.from_pretrained(str(folder))
        starts = MessageStarts(tok)
        prompt = render_prompt(tok, msgs)
        cuts = starts.reply_header_cuts(msgs, prompt)
        own = [len(render_prompt(tok, msgs[:i])) - 1 for i in (1, 3)]  # turns 1 and 2's prompts
        assert cuts == (own if want else []), (folder.name, cuts, own)
        assert len(starts(msgs, prompt)) == 5  # the message starts are there either way


def _blocks_upto(row: dict, end: int) -> list[str]:
    """The names of a manifest's blocks that end at or before `end` (they must end at `end`)."""
    n = len(row["tokens"])
    ends = sorted({e for e in row["block_ends"] if 0 < e < n} | {n})
    assert end in ends, (end, ends)
    return [k for k, e in zip(row["blocks"], ends) if e <= end]


def test_every_earlier_turns_regenerate_point_is_stored_once_on_disk(models, tmp_path):
    """Three turns through an Engine with a disk tier: each earlier turn's regenerate point (its
    prompt but the last token, header block included) is named by the next turn's manifest, so
    the disk holds one chain: exactly the blocks of the last turn's manifest. A restart then
    regenerates turn 1 from those shared blocks, bit-identical."""
    root = tmp_path / "cache"
    eng = Engine(cache_dir=root, chunk=8)
    eng.load(str(models["llama"]))
    regen_points = []  # per turn: the block names of its regenerate point, read after it is saved
    turns = []
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTIONS[0]}]
    for t in range(3):
        req = request(msgs, max_tokens=12)
        r = eng.generate(req)
        assert eng.cache.disk.flush(60)
        turns.append((req, r))
        n = len(r.prompt_ids)
        rows = json.loads((root / "index.json").read_text())["entries"]
        mine = [row for row in rows if row["tokens"][: n - 1] == r.prompt_ids[:-1]]
        regen_points.append(_blocks_upto(max(mine, key=lambda row: len(row["tokens"])), n - 1))
        msgs = msgs + [{"role": "assistant", "content": r.text}, {"role": "user", "content": FOLLOW_UPS[t]}]
    stats = eng.cache.disk.stats()
    eng.close()
    rows = json.loads((root / "index.json").read_text())["entries"]
    last = max(rows, key=lambda row: len(row["tokens"]))
    for i, names in enumerate(regen_points[:-1]):
        assert last["blocks"][: len(names)] == names, f"turn {i + 1}'s regenerate point is not shared"
    # One chain: every block on disk is one of the last manifest's (none kept for a single turn).
    assert stats["blocks"] == len(last["blocks"]) == len(set(last["blocks"]))
    assert {k for row in rows for k in row["blocks"]} == set(last["blocks"])
    # A restart regenerates turn 1 from the shared blocks: restored at its prompt but the last
    # token, from disk, and the same reply bit for bit.
    (req1, first) = turns[0]
    again_eng = Engine(cache_dir=root, chunk=8)
    again_eng.load(str(models["llama"]))
    again = again_eng.generate(req1)
    again_eng.close()
    assert again.report.source == "disk" and again.report.restored == len(first.prompt_ids) - 1
    assert (again.tokens, again.logprobs) == (first.tokens, first.logprobs)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_exact_follow_ups_restore_the_previous_regenerate_point_and_equal_cold(models, family):
    """Exact mode, C = 512: every follow-up restores the previous turn's prompt but its last
    token (a reply header cut; for gemma3's wrapped window, its pre-last snapshot whole) and
    prefills from there; the reply equals a cold run's bit for bit."""
    require_openblas()
    eng = make_engine(models[family], chunk=512)
    cold_eng = make_engine(models[family], chunk=512)
    logs = []
    turns = _chat(eng, 4, first=QUESTIONS[1], logs=logs)
    for k in range(1, len(turns)):
        (_, prev), (req, r) = turns[k - 1], turns[k]
        start = len(prev.prompt_ids) - 1
        assert r.report.restored == start, (family, k, r.report.declines)
        if family == "gemma3":  # its window wrapped: turn k's pre-last snapshot, whole
            assert r.report.stored == start and not r.report.partial
        else:  # turn k's end snapshot, cut back
            assert r.report.stored > start and r.report.partial
        assert logs[k].spans[0][0] == start and all(o in (None, start) for o in logs[k].calls[0][1])
        cold = cold_eng.generate(cold_request(req))
        assert (r.tokens, r.logprobs) == (cold.tokens, cold.logprobs), (family, k)


def test_control_without_reply_header_cuts_the_cold_run_differs(models):
    """The control arm: a cold run cut at the message starts but not at the reply header cuts
    forwards each earlier header with the reply after it, other widths, and with OpenBLAS its
    logprobs differ from the warm exact reply. So the test above can fail."""
    require_openblas()
    differ = total = 0
    for family in ("llama", "gemma3"):
        for q in QUESTIONS:
            eng = make_engine(models[family], chunk=512)
            for req, r in _chat(eng, 3, first=q)[1:]:
                p = eng.prepare(req)
                assert p.reply_header_cuts
                uncut = drain(stream(eng.lm, dataclasses.replace(p, request=dataclasses.replace(p.request, use_cache=False),
                                                                 reply_header_cuts=[]), None, eng.chunk))
                total += 1
                differ += uncut.tokens != r.tokens or uncut.logprobs != r.logprobs
    assert differ >= total // 2 + 1, f"only {differ}/{total} differed"


def test_the_debug_panel_marks_reply_header_cuts():
    from app.core.conversation.view_models import chunks_text

    text = chunks_text([[0, 10], [10, 22], [22, 27], [27, 28]], [10, 22], [27])
    assert text == ("4 forwards: [0, 10)✉ [10, 22)✉ [22, 27)↩ [27, 28)\n"
                    "✉ message starts: 10, 22\n↩ reply header cuts: 27")
