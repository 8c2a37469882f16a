"""Continue: a stopped reply (or one that ended at max_tokens) goes on exactly as the reply that
was never stopped, tokens and logprobs bit for bit, at T=0 and T>0 (exact mode); the cache
restores the state before the reply's last token (prompt + n - 1) and forwards that token alone.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from engine.engine import Engine
from engine.errors import RequestError
from engine.types import CancelToken, Continuation, GenerationRequest, GenerationResult, TokenEvent
from tests.engine_helpers import forwards, make_engine, model_dir, request

MSGS = [{"role": "user", "content": "Why is the sky blue?"}]
FULL = 20  # the unstopped reply's max_tokens
SETTINGS: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0.0},
    "sampled": {"temperature": 1.0, "seed": 7},
    "sampled_penalty": {"temperature": 0.8, "top_p": 0.9, "seed": 3, "repetition_penalty": 1.3},
}


def stop_after(eng: Engine, req: GenerationRequest, k: int) -> GenerationResult:
    """`req` stopped (cancelled) once its k-th token arrived."""
    cancel = CancelToken()

    def on_event(e: Any) -> None:
        if isinstance(e, TokenEvent) and e.index == k - 1:
            cancel.cancel()

    r = eng.generate(req, on_event, cancel)
    assert r.finish_reason == "cancelled" and len(r.tokens) == k
    return r


def continued(eng: Engine, req: GenerationRequest, part: GenerationResult) -> GenerationResult:
    c = Continuation(tuple(part.tokens), logprobs=tuple(part.logprobs))
    return eng.generate(dataclasses.replace(req, continuation=c))


def assert_whole(part: GenerationResult, cont: GenerationResult, full: GenerationResult) -> None:
    assert part.tokens + cont.tokens == full.tokens
    assert part.logprobs + cont.logprobs == full.logprobs  # exactly: bit-equal floats
    assert part.text[: cont.report.continued_chars] + cont.text == full.text
    assert cont.finish_reason == full.finish_reason


@pytest.mark.parametrize("how", ["stopped", "max_tokens"])
@pytest.mark.parametrize("name", list(SETTINGS))
def test_continue_equals_the_unstopped_reply(llama: Path, name: str, how: str) -> None:
    full_eng = make_engine(llama)
    full = full_eng.generate(request(MSGS, max_tokens=FULL, **SETTINGS[name]))
    assert len(full.tokens) == FULL, "the tiny model's reply should run to max_tokens"
    eng = make_engine(llama)
    req = request(MSGS, max_tokens=FULL, **SETTINGS[name])
    k = 7
    if how == "stopped":
        part = stop_after(eng, req, k)
    else:
        part = eng.generate(request(MSGS, max_tokens=k, **SETTINGS[name]))
        assert part.finish_reason == "length" and len(part.tokens) == k
    n = len(part.prompt_ids)
    with forwards(eng) as log:
        cont = continued(eng, req, part)
    assert_whole(part, cont, full)
    r = cont.report
    # The cache restored the state before the reply's last token: nothing prefilled but that token.
    assert (r.continued_from, r.restored, r.prefill_tokens) == (k, n + k - 1, 1)
    assert r.prompt_tokens == n and r.mode == "exact"
    assert log.spans[0] == (n + k - 1, n + k)  # the reply's last token, alone, on the restored state
    assert all(b - a == 1 for a, b in log.spans)
    assert "restored" in r.continue_note and "prefilled 1" in r.continue_note
    # Compared with the unstopped run of the same prompt and settings (this engine's first): identical.
    eng.generate(req)
    again = continued(eng, req, part)
    assert again.report.identical is True and again.tokens == cont.tokens


@pytest.mark.parametrize("name", ["greedy", "sampled"])
def test_continue_without_a_snapshot_recomputes_with_the_same_forwards(llama: Path, name: str) -> None:
    full = make_engine(llama).generate(request(MSGS, max_tokens=FULL, **SETTINGS[name]))
    part = make_engine(llama).generate(request(MSGS, max_tokens=6, **SETTINGS[name]))
    eng = make_engine(llama)  # a new engine: its cache holds nothing
    req = request(MSGS, max_tokens=FULL, **SETTINGS[name])
    n = len(part.prompt_ids)
    with forwards(eng) as log:
        cont = continued(eng, req, part)
    assert_whole(part, cont, full)
    r = cont.report
    assert r.restored == 0 and r.prefill_tokens == n + 6
    # The prompt in its canonical chunks, then each reply token alone, as decoding forwarded them.
    assert [list(s) for s in log.spans[: len(r.chunks) - 1]] == r.chunks[:-1]
    assert r.chunks[-7:] == [[p, p + 1] for p in range(n - 1, n + 6)]
    assert "recomputed" in r.continue_note
    # And a cold run of the continuation is the same.
    cold = eng.cold_run(dataclasses.replace(req, continuation=Continuation(tuple(part.tokens))))
    assert (cold.tokens, cold.logprobs) == (cont.tokens, cont.logprobs)


@pytest.mark.parametrize("family", ["gemma3", "lfm2"])
def test_continue_other_cache_families(tmp_path: Path, family: str) -> None:
    """Sliding windows and SSM state: exact either way (restored, or recomputed and said why)."""
    folder = model_dir(tmp_path, family)
    s = SETTINGS["sampled"]
    full = make_engine(folder).generate(request(MSGS, max_tokens=FULL, **s))
    eng = make_engine(folder)
    req = request(MSGS, max_tokens=FULL, **s)
    part = stop_after(eng, req, 5)
    cont = continued(eng, req, part)
    assert_whole(part, cont, full)
    assert cont.report.continue_note.startswith("continued from token 5")


def test_continue_twice_and_the_text_form(llama: Path) -> None:
    s = SETTINGS["sampled"]
    full = make_engine(llama).generate(request(MSGS, max_tokens=FULL, **s))
    eng = make_engine(llama)
    req = request(MSGS, max_tokens=FULL, **s)
    a = stop_after(eng, req, 4)
    b = stop_after(eng, dataclasses.replace(req, continuation=Continuation(tuple(a.tokens))), 5)
    ab = dataclasses.replace(a, tokens=a.tokens + b.tokens, logprobs=a.logprobs + b.logprobs,
                             text=a.text[: b.report.continued_chars] + b.text)
    c = continued(eng, req, ab)
    assert_whole(ab, c, full)
    assert c.report.restored == len(a.prompt_ids) + 9 - 1
    # The text form encodes the reply so far; where it encodes to the same ids, the same reply.
    ids = eng.lm.tokenizer.encode(ab.text, add_special_tokens=False)
    if ids == ab.tokens:
        t = eng.generate(dataclasses.replace(req, continuation=Continuation(text=ab.text)))
        assert t.tokens == c.tokens


def test_continue_refusals(llama: Path) -> None:
    eng = make_engine(llama)
    part = eng.generate(request(MSGS, max_tokens=5))
    with pytest.raises(RequestError, match="max_tokens"):
        eng.generate(dataclasses.replace(request(MSGS, max_tokens=5), continuation=Continuation(tuple(part.tokens))))
    eos = next(iter(eng.lm.eos_ids))
    with pytest.raises(RequestError, match="end token"):
        eng.generate(dataclasses.replace(request(MSGS), continuation=Continuation((*part.tokens, eos))))
    with pytest.raises(RequestError, match="empty"):
        eng.generate(dataclasses.replace(request(MSGS), continuation=Continuation(())))


# -- attached to a server: the extension field, and the app's remote engine ----------------------


@pytest.mark.parametrize("name", ["greedy", "sampled"])
def test_continue_on_a_server_and_through_the_remote_engine(llama: Path, tmp_path: Path, name: str) -> None:
    from engine.remote import RemoteEngine
    from tests.server_helpers import Server

    s = SETTINGS[name]
    full = make_engine(llama).generate(request(MSGS, max_tokens=FULL, **s))
    srv = Server(llama, None)
    try:
        client = srv.client()
        kw = {"temperature": s["temperature"], "seed": s.get("seed", 0), "logprobs": True}
        part = client.chat.completions.create(model=srv.model, messages=MSGS, max_tokens=6, **kw)
        ids = part.verbatim["token_ids"]
        assert ids == full.tokens[:6]
        cont = client.chat.completions.create(
            model=srv.model, messages=[*MSGS, {"role": "assistant", "content": part.choices[0].message.content}],
            max_tokens=FULL, extra_body={"verbatim": {"continue": ids}}, **kw)
        v = cont.verbatim
        assert ids + v["token_ids"] == full.tokens
        lps = [e.logprob for e in part.choices[0].logprobs.content + cont.choices[0].logprobs.content]
        assert lps == full.logprobs
        assert part.choices[0].message.content[: v["continued_chars"]] + cont.choices[0].message.content == full.text
        n = v["prompt_tokens"]
        assert (v["continued_from"], v["restored"], v["prefill_tokens"]) == (6, n + 5, 1)
        assert cont.usage.completion_tokens == FULL - 6

        # The app's remote engine: a reply stopped part way, continued, as the in-process engine does.
        remote = RemoteEngine(srv.url.removesuffix("/v1"))
        remote.load()
        req = request(MSGS, max_tokens=FULL, **s)
        stopped = stop_after(remote, req, 4)  # type: ignore[arg-type]
        assert stopped.tokens == full.tokens[:4]
        go_on = remote.generate(dataclasses.replace(req, continuation=Continuation(tuple(stopped.tokens))))
        assert stopped.tokens + go_on.tokens == full.tokens
        assert stopped.logprobs + go_on.logprobs == full.logprobs
        assert go_on.report.continued_from == 4 and go_on.report.restored == n + 3
        assert "restored" in go_on.report.continue_note
    finally:
        srv.close()


def test_the_server_refuses_a_malformed_continue(llama: Path) -> None:
    import openai

    from tests.server_helpers import Server

    srv = Server(llama, None)
    try:
        client = srv.client()
        for bad_value in ("yes", [], [-1]):
            with pytest.raises(openai.BadRequestError, match="verbatim.continue"):
                client.chat.completions.create(model=srv.model, messages=MSGS, max_tokens=8,
                                               extra_body={"verbatim": {"continue": bad_value}})
        with pytest.raises(openai.BadRequestError, match="assistant"):
            client.chat.completions.create(model=srv.model, messages=MSGS, max_tokens=8,
                                           extra_body={"verbatim": {"continue": True}})
    finally:
        srv.close()


def test_a_continued_reply_never_reports_more_cached_tokens_than_prompt_tokens(llama: Path) -> None:
    """usage: the reply so far the client sends back is input the cache restores, so it counts in
    prompt_tokens (a repeated `continue: [ids]` reported 37 cached of 35 prompt tokens)."""
    from tests.server_helpers import Server

    srv = Server(llama, None)
    try:
        client = srv.client()
        part = client.chat.completions.create(model=srv.model, messages=MSGS, max_tokens=6, temperature=0.0)
        ids = part.verbatim["token_ids"]
        history = [*MSGS, {"role": "assistant", "content": part.choices[0].message.content}]
        for _ in range(2):  # the second restores the first's state: the most cached
            cont = client.chat.completions.create(model=srv.model, messages=history, max_tokens=FULL, temperature=0.0,
                                                  extra_body={"verbatim": {"continue": ids}})
            usage, v = cont.usage, cont.verbatim
            assert usage.prompt_tokens == v["prompt_tokens"] + len(ids)
            assert usage.prompt_tokens_details.cached_tokens == v["restored"] <= usage.prompt_tokens
            assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    finally:
        srv.close()
