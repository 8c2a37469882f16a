"""Every parameter the local server accepts does what OpenAI documents, or is refused by name.

logit_bias changes the reply (and a biased reply regenerates identically, also from a receipt);
tool_choice, modalities and unknown fields get 400 naming them; user/metadata/store are no-ops;
max_completion_tokens is preferred; the default max_tokens fits the context; malformed bodies
get OpenAI error objects; /v1/models/{id}; Retry-After on 429; no absolute paths in responses;
greedy replies compare as identical whatever seed was drawn.
"""

from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path
from typing import Any, Optional

import openai
import pytest

from engine import receipts
from engine.engine import Engine
from engine.receipts import ReceiptModel
from engine.types import GenerationRequest, SamplerSettings
from tests.server_helpers import SKY, TIMEOUT, Raw, Server, chat, http, lps


def post(server: Server, body: Any, raw: Optional[bytes] = None, path: str = "/chat/completions") -> Raw:
    content = raw if raw is not None else json.dumps(body).encode()
    return http(server.url + path, content, {"Content-Type": "application/json"})


def error_of(r: Raw) -> dict[str, Any]:
    return r.json()["error"]


def test_logit_bias_bans_the_first_token_and_a_biased_reply_regenerates_identically(server: Server) -> None:
    c = server.client()
    msgs = [{"role": "user", "content": "Name a colour."}]
    plain = chat(c, server.model, msgs, max_tokens=8, logprobs=True)
    first = plain.verbatim["token_ids"][0]
    bias = {str(first): -100}
    banned = [chat(c, server.model, msgs, max_tokens=8, logprobs=True, logit_bias=bias) for _ in range(2)]
    assert banned[0].verbatim["token_ids"][0] != first
    assert first not in banned[0].verbatim["token_ids"]
    assert banned[0].verbatim["token_ids"] != plain.verbatim["token_ids"]
    assert banned[0].verbatim["sampler"]["logit_bias"] == {str(first): -100.0}
    # The regenerate: identical tokens and bit-equal logprobs, restored from the cache.
    assert banned[1].verbatim["token_ids"] == banned[0].verbatim["token_ids"] and lps(banned[1]) == lps(banned[0])
    assert banned[1].verbatim["identical_to_previous"] is True
    assert banned[1].usage.prompt_tokens_details.cached_tokens == banned[1].usage.prompt_tokens - 1
    # A positive bias forces a token (greedy): every token is the favoured one until the end.
    favoured = banned[0].verbatim["token_ids"][1]
    forced = chat(c, server.model, msgs, max_tokens=5, logit_bias={str(favoured): 100})
    assert forced.verbatim["token_ids"] == [favoured] * 5
    # Streamed: the same tokens.
    stream = chat(c, server.model, msgs, max_tokens=8, logit_bias=bias, stream=True)
    last = [ch for ch in stream if ch.choices and ch.choices[0].finish_reason][-1]
    assert last.verbatim["token_ids"] == banned[0].verbatim["token_ids"]


def test_a_biased_reply_replays_from_its_receipt(tiny_model: Path, tmp_path: Path) -> None:
    eng = Engine(use_disk=False, chunk=8)
    info = eng.load(str(tiny_model))
    plain = eng.generate(GenerationRequest(SKY, SamplerSettings(max_tokens=6, temperature=0.9, seed=5)))
    req = GenerationRequest(SKY, SamplerSettings(max_tokens=6, temperature=0.9, seed=5,
                                                 logit_bias={str(plain.tokens[0]): -100}))
    result = eng.generate(req)
    assert result.tokens[0] != plain.tokens[0]
    receipt = receipts.build(req, result, ReceiptModel(str(tiny_model), info.key, info.name, info.dequantized),
                             eng.chunk)
    path = tmp_path / "r.json"
    receipts.write(receipt, path)
    assert json.loads(path.read_text())["sampler"]["logit_bias"] == {str(plain.tokens[0]): -100.0}
    back = receipts.read(path)
    assert back.sampler.logit_bias == ((plain.tokens[0], -100.0),)
    verdict = receipts.replay(back, eng, use_cache=False)
    assert verdict.ok and verdict.tokens == result.tokens


def test_malformed_logit_bias_is_refused_by_name(server: Server) -> None:
    vocab = server.engine(lambda e: e.lm.model.args.vocab_size)
    for bias in ("x", [1, 2], {"abc": 1}, {"-3": 1}, {"5": 101}, {"5": -100.5}, {"5": "1"}, {"5": True},
                 {str(vocab): 1}, {str(i): 1 for i in range(301)}):
        r = post(server, {"messages": SKY, "max_tokens": 2, "logit_bias": bias})
        assert r.status_code == 400 and error_of(r)["param"] == "logit_bias", (bias, r.json())


def test_parameters_that_would_change_the_reply_are_refused_by_name(server: Server) -> None:
    for extra, param in [
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
        ({"reasoning_effort": 3}, "reasoning_effort"),  # accepted as a string (issue 47), checked for its type
        ({"parallel_tool_calls": True}, "parallel_tool_calls"),
        ({"function_call": "auto"}, "function_call"),
        ({"max_tokens": 5, "max_completion_tokens": 6}, "max_completion_tokens"),
        ({"verbatim": {"mode": "exact", "turbo": True}}, "verbatim.turbo"),
        ({"stream_options": {"include_usage": True, "x": 1}}, "stream_options.x"),
        ({"user": 5}, "user"),
        ({"metadata": {"k": 1}}, "metadata"),
        ({"store": "yes"}, "store"),
    ]:
        r = post(server, {"messages": SKY, "max_tokens": 2, **extra})
        assert r.status_code == 400 and error_of(r)["param"] == param, (extra, r.json())
    r = post(server, {"prompt": "x", "max_tokens": 2, "messages": SKY}, path="/completions")
    assert r.status_code == 400 and error_of(r)["param"] == "messages"
    with pytest.raises(openai.BadRequestError) as e:
        chat(server.client(), server.model, tool_choice="required")
    assert e.value.body["param"] == "tool_choice"


def test_documented_no_ops_and_max_completion_tokens(server: Server) -> None:
    c = server.client()
    base = chat(c, server.model, max_tokens=5)
    same = chat(c, server.model, max_tokens=None, max_completion_tokens=5, user="u-1", metadata={"run": "a"}, store=False,
                tool_choice="none", modalities=["text"])
    assert same.verbatim["token_ids"] == base.verbatim["token_ids"] and len(base.verbatim["token_ids"]) == 5
    both = chat(c, server.model, max_tokens=3, max_completion_tokens=3)
    assert len(both.verbatim["token_ids"]) == 3
    preferred = post(server, {"messages": SKY, "temperature": 0, "max_completion_tokens": 4, "max_tokens": None})
    assert len(preferred.json()["verbatim"]["token_ids"]) == 4


def test_the_default_max_tokens_fits_the_context(server: Server) -> None:
    c = server.client()
    old = server.engine(lambda e: e.context_length)
    server.engine(lambda e: setattr(e, "context_length", 64))
    try:
        msgs = [{"role": "user", "content": "count: one two three four five six seven eight nine ten"}]
        r = post(server, {"messages": msgs, "temperature": 0})  # no max_tokens: fits what is left
        assert r.status_code == 200, r.json()
        body = r.json()
        n = body["usage"]["prompt_tokens"]
        assert body["verbatim"]["sampler"]["max_tokens"] == 64 - n
        assert body["usage"]["completion_tokens"] <= 64 - n
        with pytest.raises(openai.BadRequestError) as e:  # an explicit one past the context: refused
            chat(c, server.model, msgs, max_tokens=512)
        assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "messages"
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model=server.model, prompt="word " * 80, max_tokens=4)
        assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "prompt"
    finally:
        server.engine(lambda e: setattr(e, "context_length", old))


def test_malformed_bodies_get_openai_errors(server: Server) -> None:
    for raw in (b"[" * 100_000 + b"]" * 100_000, b'{"messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
                b'{"a": 1' + b"0" * 5000 + b"}"):
        r = post(server, None, raw)
        assert r.status_code == 400 and error_of(r)["type"] == "invalid_request_error", r.body[:200]
    r = post(server, None, b'{"messages": [{"role": "user", "content": "a\\ud800b"}], "max_tokens": 2}')
    err = error_of(r)
    assert r.status_code == 400 and err["param"] == "messages[0].content" and "surrogate" in err["message"]
    assert "U+D800" in err["message"]
    r = post(server, None, b'{"prompt": "\\udfff", "max_tokens": 2}', path="/completions")
    assert r.status_code == 400 and error_of(r)["param"] == "prompt"
    paired = post(server, None, b'{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}], "max_tokens": 2}')
    assert paired.status_code == 200  # a surrogate pair is an ordinary character


def test_models_by_id_and_no_absolute_paths_in_responses(server: Server, tiny_model: Path) -> None:
    c = server.client()
    assert c.models.retrieve(server.model).id == server.model
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("no-such-model")
    listed = http(server.url + "/models")
    status = http(server.url.removesuffix("/v1") + "/verbatim/status")
    reply = post(server, {"messages": SKY, "max_tokens": 2})
    bad = post(server, {"messages": SKY, "max_tokens": 2, "model": "nope"})
    for r in (listed, status, reply, bad):
        text = r.body.decode()
        assert str(tiny_model) not in text and str(tiny_model.parent) not in text, text[:300]


def test_a_full_queue_says_when_to_retry(tiny_model: Path) -> None:
    s = Server(tiny_model, None, queue_limit=1)
    try:
        release = s.gate()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            fut = pool.submit(chat, s.client(), s.model, max_tokens=2)
            s.wait_state(lambda st: st.waiting >= 1)
            with pytest.raises(openai.RateLimitError) as full:
                chat(s.client(), s.model, max_tokens=2)
            assert int(full.value.response.headers["retry-after"]) >= 1
            release.set()
            assert len(fut.result(TIMEOUT).verbatim["token_ids"]) == 2
    finally:
        s.close()


def test_greedy_replies_compare_identical_whatever_seed_was_drawn(server: Server) -> None:
    c = server.client()
    msgs = [{"role": "user", "content": "Greedy, any seed."}]
    replies = [c.chat.completions.create(model=server.model, messages=msgs, temperature=0, max_tokens=6)
               for _ in range(2)]
    assert replies[1].verbatim["token_ids"] == replies[0].verbatim["token_ids"]
    assert replies[1].verbatim["identical_to_previous"] is True
    sampled = chat(c, server.model, msgs, temperature=0.9, seed=1, max_tokens=6)
    other = chat(c, server.model, msgs, temperature=0.9, seed=2, max_tokens=6)
    assert other.verbatim["identical_to_previous"] is None  # a different seed is a different request
    assert sampled.verbatim["identical_to_previous"] is None


def test_streamed_chunks_name_their_token_ids_when_asked(server: Server) -> None:
    """`"verbatim": {"token_ids": true}`: each chunk that carries a token names its id (what
    engine/remote.py needs to keep the ids of a reply it stops); the ids add up to the final ones."""
    body = {"model": "", "messages": [{"role": "user", "content": "Name a colour."}], "stream": True,
            "logprobs": True, "max_tokens": 12, "seed": 3, "verbatim": {"token_ids": True}}
    r = post(server, body)
    assert r.status_code == 200, r.body
    chunks = [json.loads(line[6:]) for line in r.body.decode().splitlines()
              if line.startswith("data: {")]
    final = chunks[-1]["verbatim"]
    per_chunk = [t for c in chunks[:-1] for t in (c.get("verbatim") or {}).get("token_ids", [])]
    last_chunk_entries = len(chunks[-1]["choices"][0]["logprobs"]["content"]) if chunks[-1]["choices"] else 0
    assert len(final["token_ids"]) == 12 and per_chunk + final["token_ids"][len(per_chunk):] == final["token_ids"]
    assert len(per_chunk) + last_chunk_entries == 12 and len(per_chunk) >= 1
    # Not asked: no ids before the end (plain OpenAI chunks).
    plain = post(server, {**body, "verbatim": {}})
    assert b'"token_ids"' not in plain.body.rsplit(b"data: {", 1)[0]
    bad = post(server, {**body, "verbatim": {"token_ids": "yes"}})
    assert bad.status_code == 400 and error_of(bad)["param"] == "verbatim.token_ids"
