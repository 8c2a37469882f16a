"""What of a reply is text (issue 47): stop strings apply to free text only, and a control token
the model samples is never text.

- A stop string never cuts inside a tool call or a constrained value (engine/generate/stops.py):
  under a grammar (a forced call, a JSON format) the whole reply is constrained, so a stop string
  changes nothing; under tool_choice "auto" the text of a call, from its start marker through
  its end marker, is no free text.
- A control token (templating.ControlTokens) ends the reply (the end tokens, `<|endoftext|>`,
  `<|im_start|>` where turns end with an end token) or is left out of the text (any other special
  token); its id and logprob stay in the reply, exact.

The tiny tool model (tests/tiny_models.py: build_tool_model) with one more special token,
`<|channel|>`, that is neither an end nor the template's.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from engine.constraint import Constraint
from engine.engine import Engine
from engine.errors import RequestError
from engine.generate.stops import StopStrings
from engine.types import Continuation, GenerationRequest, SamplerSettings, TokenEvent
from tests.server_helpers import Server
from tests.tool_fixtures import JSON_SCHEMA, WEATHER
from tests.tiny_models import build_tool_model

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALLS = ("<tool_call>", "</tool_call>")
HIDDEN = "<|channel|>"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tool_model(tmp_path_factory.mktemp("models") / "qwen-tools-channel", special=[HIDDEN])


@pytest.fixture(scope="module")
def engine(folder: Path) -> Iterator[Engine]:
    eng = Engine(use_disk=False, chunk=8)
    eng.load(str(folder))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[Server]:
    s = Server(folder, None)
    yield s
    s.close()


def _id(eng: Engine, token: str) -> int:
    return int(eng.lm.tokenizer.convert_tokens_to_ids(token))


def _req(max_tokens: int = 96, seed: int = 1, **kw: Any) -> GenerationRequest:
    bias = kw.pop("logit_bias", ())
    return GenerationRequest(ASK, SamplerSettings(temperature=1.0, seed=seed, max_tokens=max_tokens,
                                                  logit_bias=bias), **kw)


def _run(eng: Engine, req: GenerationRequest) -> tuple[Any, list[TokenEvent]]:
    events: list[TokenEvent] = []
    result = eng.generate(req, lambda e: events.append(e) if isinstance(e, TokenEvent) else None)
    return result, events


# -- stop strings: free text only --------------------------------------------------------------


def _call_args(text: str) -> dict[str, Any]:
    """The one call of a reply in the tool model's markup, parsed."""
    assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>"), text
    call = json.loads(text[len("<tool_call>\n"): -len("\n</tool_call>")])
    assert call["name"] == "get_weather"
    return call["arguments"]


def test_a_stop_string_never_cuts_a_forced_tool_call(engine: Engine) -> None:
    base = _req(constraint=Constraint.of([WEATHER], "required", False))
    free = engine.generate(base)
    assert _call_args(free.text)["city"] in ("Paris", "Rome", "Oslo")
    stopped, events = _run(engine, replace(base, stop=("\n", "{", '"', "Paris")))
    assert (stopped.tokens, stopped.logprobs, stopped.text, stopped.finish_reason) == \
        (free.tokens, free.logprobs, free.text, free.finish_reason)
    assert "".join(e.text for e in events) == stopped.text  # streamed whole, nothing held back for good


def test_a_stop_string_never_cuts_a_constrained_value(engine: Engine) -> None:
    base = _req(constraint=Constraint.of(response_format=JSON_SCHEMA))
    free = engine.generate(base)
    stopped = engine.generate(replace(base, stop=("{", '"', ",", ": ")))
    assert (stopped.tokens, stopped.text) == (free.tokens, free.text)
    assert set(json.loads(stopped.text)) == {"city", "temp", "sunny"}


def test_a_stop_string_inside_an_unforced_call_does_not_end_the_reply(engine: Engine) -> None:
    """tool_choice "auto" decodes freely; a reply continued from inside a call (a Continue of a
    reply cut there) holds the stop string "\\n" in the call's markup: that is no end."""
    tok = engine.lm.tokenizer
    so_far = tuple(tok.encode('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa',
                              add_special_tokens=False))
    base = _req(max_tokens=40, seed=2, constraint=Constraint.of([WEATHER], "auto"),
                continuation=Continuation(so_far))
    free = engine.generate(base)
    try:
        stopped = engine.generate(replace(base, stop=("\n",)))
    except RequestError as e:  # "the reply ended at the stop string"
        pytest.fail(f"the reply so far was taken as ended: {e}")
    assert stopped.tokens == free.tokens and stopped.text == free.text


def _free_starts(text: str, stops: tuple[str, ...], calls: Optional[tuple[str, str]]) -> set[int]:
    """Where a stop string starts wholly inside the free text of a finished `text` (plainly)."""
    free: list[tuple[int, int]] = []
    pos = 0
    while calls is not None and (j := text.find(calls[0], pos)) >= 0:
        free.append((pos, j))
        k = text.find(calls[1], j + len(calls[0]))
        pos = len(text) if k < 0 else k + len(calls[1])
    free.append((pos, len(text)))
    return {i for a, b in free for s in stops for i in range(a, b) if text.startswith(s, i) and i + len(s) <= b}


def _stream(text: str, cuts: list[int], stops: tuple[str, ...], calls: Optional[tuple[str, str]]
            ) -> tuple[str, str]:
    """`text` grown at `cuts` as decode grows it: (what was handed out, the final text)."""
    s = StopStrings(stops, calls)
    sent = ""
    for end in cuts:
        at = s.find(text[:end])
        if at is not None:
            return sent, text[:at]
        shown = s.shown(text[:end])
        assert shown.startswith(sent)
        sent = shown
    at = s.find(text, final=True)
    return sent, text if at is None else text[:at]


def test_stop_strings_outside_calls_match_a_plain_search_and_stream_whole() -> None:
    """Texts of free stretches and calls (closed, unclosed, markers split over tokens), random
    stop strings, random token cuts: a reply is cut only where a stop string lies wholly in free
    text, always when one does, and the handed-out text is a prefix of the final text."""
    rng = random.Random(47)
    pieces = ["Hi", " there", "\n", "<", "<tool", "_call>", "<tool_call>", "\n{\"a\": 1}\n", "</tool_call>",
              "</tool", "_call>", "Bye.", "{", '"', "x\ny"]
    for _ in range(600):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
        stops = tuple(rng.choice(["\n", "{", "<t", "Bye", "_call>", '"a', "y", "</tool_call>\nH"])
                      for _ in range(rng.randint(1, 3)))
        calls = rng.choice([CALLS, None])
        cuts = sorted(set(rng.sample(range(1, len(text) + 1), k=min(len(text), rng.randint(1, 6)))))
        sent, final = _stream(text, cuts, stops, calls)
        starts = _free_starts(text, stops, calls)
        # Cut at a stop string in free text, or not cut because there is none.
        assert len(final) in starts if final != text else not starts, (text, stops, calls, cuts)
        assert final.startswith(sent), (text, stops, calls, cuts)


def test_stop_strings_apply_around_calls() -> None:
    text = 'Let me check.\n<tool_call>\n{"a": 1}\n</tool_call>\nDone.\n'
    assert _stream(text, list(range(1, len(text) + 1)), ("\n",), CALLS)[1] == "Let me check."
    after = '<tool_call>\n{"a": 1}\n</tool_call>\nDone.'
    assert _stream(after, [5, 11, 20, len(after)], ("\n",), CALLS)[1] == '<tool_call>\n{"a": 1}\n</tool_call>'
    unclosed = '<tool_call>\n{"a": "x\ny'
    assert _stream(unclosed, [len(unclosed)], ("\n", "y"), CALLS)[1] == unclosed
    # A possible marker's start is held back until it is known: "<t" is a stop string only if
    # it does not begin a call.
    s = StopStrings(("<t",), CALLS)
    assert s.find("ab<t") is None and s.shown("ab<t") == "ab"
    assert s.find("ab<tool_call>") is None and s.shown("ab<tool_call>{") == "ab<tool_call>{"
    s = StopStrings(("<t",), CALLS)
    assert s.find("ab<t") is None and s.find("ab<tx") == 2


# -- control tokens are never text --------------------------------------------------------------


def test_the_tool_models_control_tokens(engine: Engine) -> None:
    c = engine.lm.controls
    assert c is not None
    ends = {_id(engine, t) for t in ("<|im_end|>", "<|endoftext|>", "<|im_start|>")}
    assert set(c.ends) == ends and set(c.hidden) == {_id(engine, HIDDEN)}
    assert not {_id(engine, t) for t in CALLS} & (c.ends | c.hidden)  # the call markers are text


@pytest.mark.parametrize("marker", ["<|endoftext|>", "<|im_start|>"])
def test_a_sampled_turn_token_ends_the_reply_as_no_text(engine: Engine, marker: str) -> None:
    t = _id(engine, marker)
    r, events = _run(engine, _req(max_tokens=8, logit_bias=((t, 100.0),)))
    assert (r.tokens, r.text, r.finish_reason, len(r.logprobs)) == ([t], "", "stop", 1)
    assert all(not e.text for e in events)


def test_a_sampled_control_token_is_left_out_of_the_text_and_kept_in_the_tokens(engine: Engine) -> None:
    t = _id(engine, HIDDEN)
    req = _req(max_tokens=24, seed=5, logit_bias=((t, 4.0),))
    r, events = _run(engine, req)
    assert t in r.tokens and any(x != t for x in r.tokens), r.tokens  # both kinds, for this seed
    assert HIDDEN not in r.text
    tok = engine.lm.tokenizer
    assert r.text == tok.decode([x for x in r.tokens if x != t])
    assert "".join(e.text for e in events) == r.text
    assert [e.token for e in events] == r.tokens[: len(events)]
    cold = engine.generate(replace(req, use_cache=False))
    assert (cold.tokens, cold.logprobs) == (r.tokens, r.logprobs)  # the ids and logprobs, exact


# -- through the server (the requests, with the openai client) -------------------------


def _ask(s: Server, **kw: Any) -> Any:
    kw.setdefault("temperature", 1.0)
    kw.setdefault("seed", 1)
    kw.setdefault("max_tokens", 96)
    return s.client().chat.completions.create(model=s.model, messages=ASK, **kw)


def test_server_stop_with_a_forced_tool_call_returns_the_call(server: Server) -> None:
    r = _ask(server, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False, stop=["\n"])
    choice = r.choices[0]
    assert choice.message.content is None and choice.finish_reason == "tool_calls"
    assert [c.function.name for c in choice.message.tool_calls] == ["get_weather"]
    assert json.loads(choice.message.tool_calls[0].function.arguments)["city"] in ("Paris", "Rome", "Oslo")


def test_server_stop_with_a_json_schema_returns_the_whole_value(server: Server) -> None:
    r = _ask(server, response_format=JSON_SCHEMA, stop=['"', "{"])
    assert set(json.loads(r.choices[0].message.content)) == {"city", "temp", "sunny"}


def test_server_content_never_holds_a_sampled_control_token(server: Server, engine: Engine) -> None:
    t = _id(engine, "<|endoftext|>")
    r = _ask(server, logit_bias={str(t): 100}, max_tokens=8)
    assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.content
    h = _id(engine, HIDDEN)
    r = _ask(server, logit_bias={str(h): 4}, max_tokens=24, seed=5)
    assert HIDDEN not in (r.choices[0].message.content or "")
