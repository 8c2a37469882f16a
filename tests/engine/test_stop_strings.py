"""Stop strings: the streamed text always concatenates to the final text, which ends before the
first stop string; text that could still start a stop string is held back by the engine
(engine/generate/stops.py), so the CLI, the window and the server stream the same.

A property test draws stop strings from the unstopped reply itself (substrings spanning token
boundaries, U+FFFD included: the tiny model's byte tokens decode to it) over several seeds, and
checks every one through the Engine API, the server (streamed and not, the real openai client)
and, for a few, `python -m engine` in a subprocess. Every run is cold (no cache), so the
comparison holds with any BLAS.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from engine.engine import Engine
from engine.types import GenerationRequest, GenerationResult, SamplerSettings, TokenEvent
from tests.engine_helpers import make_engine
from tests.cli_helpers import ROOT, run_cli, write
from tests.server_helpers import Server, collect_stream

MESSAGES = [{"role": "user", "content": "Tell me about café and naïve señor."}]
MAX_TOKENS = 24
TEMPERATURE = 1.0
# Seeds whose reply runs to MAX_TOKENS (seed 3's samples <|im_start|>, a control token that ends
# the reply: engine/generate/templating.py, ControlTokens).
SEEDS = (1, 2, 4, 5, 6)
STOPS_PER_SEED = 8  # 40 cases in all
CHUNK = 8  # the server's and the CLI's too: every surface runs the same schedule


@dataclasses.dataclass(frozen=True)
class Unstopped:
    seed: int
    text: str
    tokens: list[int]
    ends: list[int]  # after each token, the length of the text handed out so far (the last: all of it)


@dataclasses.dataclass(frozen=True)
class Case:
    seed: int
    stop: str
    expected: str  # the unstopped text up to the first occurrence of the stop string

    def __repr__(self) -> str:
        return f"seed {self.seed} stop {self.stop!r}"


def req(seed: int, stop: tuple[str, ...] = ()) -> GenerationRequest:
    return GenerationRequest(MESSAGES, SamplerSettings(temperature=TEMPERATURE, seed=seed, max_tokens=MAX_TOKENS),
                             stop=stop, use_cache=False)


def streamed(engine: Engine, request: GenerationRequest) -> tuple[str, GenerationResult]:
    texts: list[str] = []
    result = engine.generate(request, lambda e: texts.append(e.text) if isinstance(e, TokenEvent) else None)
    return "".join(texts), result


def unstopped(engine: Engine, seed: int) -> Unstopped:
    ends: list[int] = []
    length = [0]

    def on_event(e: object) -> None:
        if isinstance(e, TokenEvent):  # the last token's may come twice: the rest of the text at the end
            length[0] += len(e.text)
            ends[e.index :] = [length[0]]

    result = engine.generate(req(seed), on_event)
    assert len(result.tokens) == MAX_TOKENS and result.finish_reason == "length"
    return Unstopped(seed, result.text, result.tokens, ends)


def draw_stops(u: Unstopped, rng: random.Random, n: int) -> list[str]:
    """`n` distinct stop strings from the reply: each spans a token boundary (starts in one
    token's text, ends in a later one's); those with a U+FFFD come first."""
    text = u.text
    bounds = sorted({e for e in u.ends if 0 < e < len(text)})
    out: list[str] = []

    def add(s: str) -> None:
        if s.strip() and s not in out and len(out) < n:
            out.append(s)

    if text.endswith("\ufffd"):  # an incomplete last character: a stop complete only at the end
        add(next(text[-k:] for k in range(1, len(text) + 1) if text.find(text[-k:]) == len(text) - k))
    for i in [i for i, ch in enumerate(text) if ch == "\ufffd"][:2]:  # U+FFFD, then with its neighbours
        add(text[i : i + 1])
        add(text[max(0, i - 1) : i + 3])
    tries = 0
    while len(out) < n and tries < 1000:
        tries += 1
        b = rng.choice(bounds)
        add(text[max(0, b - rng.randint(1, 3)) : b + rng.randint(1, 3)])
    return out


@pytest.fixture(scope="module")
def engine(tiny_model: Path) -> Iterator[Engine]:
    eng = make_engine(tiny_model, chunk=CHUNK)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def cases(engine: Engine) -> list[Case]:
    rng = random.Random(22)
    out = []
    for seed in SEEDS:
        u = unstopped(engine, seed)
        for stop in draw_stops(u, rng, STOPS_PER_SEED):
            out.append(Case(seed, stop, u.text[: u.text.find(stop)]))
    assert len(out) == len(SEEDS) * STOPS_PER_SEED
    assert any("\ufffd" in c.stop for c in out), "no stop string with U+FFFD: the draw lost its point"
    assert any(c.stop[-1] == "\ufffd" and len(c.expected) + len(c.stop) == len(unstopped(engine, c.seed).text)
               for c in out), "no stop string completed only by the last, incomplete character"
    return out


def test_the_reported_leak_is_gone(engine: Engine) -> None:
    """Issue 22's reproduction: a stop string spanning tokens after a U+FFFD."""
    for stop, final in (("fa ", "V]\ufffdie"), ("a S", "V]\ufffdief"), ("\ufffd", "V]")):
        text, result = streamed(engine, req(1, (stop,)))
        assert (text, result.text, result.finish_reason) == (final, final, "stop"), stop


def first_stop(u: Unstopped, stops: tuple[str, ...]) -> str:
    """The reply cut where generation must end: at the first token whose text completes a stop
    string, before the earliest stop string in the text so far."""
    for end in u.ends:
        hits = [u.text[:end].find(s) for s in stops if s in u.text[:end]]
        if hits:
            return u.text[: min(hits)]
    raise AssertionError(f"no stop string of {stops} in the reply")


def test_engine_streams_exactly_the_final_text_for_random_stop_strings(engine: Engine, cases: list[Case]) -> None:
    references = {seed: unstopped(engine, seed) for seed in SEEDS}
    for case in cases:
        text, result = streamed(engine, req(case.seed, (case.stop,)))
        assert result.text == case.expected, case
        assert text == result.text, case
        assert result.finish_reason == "stop", case
        # Stopping changes no draw: the tokens are the unstopped reply's, up to the one whose
        # text completed the stop string (and not one more).
        ref, n = references[case.seed], len(result.tokens)
        assert n > 0 and result.tokens == ref.tokens[:n], case
        assert n == 1 or case.stop not in ref.text[: ref.ends[n - 2]], case
        assert case.stop in ref.text[: ref.ends[n - 1]], case


def test_several_stop_strings_end_at_the_first_completed(engine: Engine) -> None:
    u = unstopped(engine, 1)
    for stops in ((u.text[2:12], u.text[8:10]), (u.text[5:7], u.text[20:30], "\x00never")):
        text, result = streamed(engine, req(1, stops))
        assert result.text == text == first_stop(u, stops), stops


def test_server_streams_exactly_the_final_text_for_random_stop_strings(tiny_model: Path, cases: list[Case]) -> None:
    s = Server(tiny_model, None, chunk=CHUNK)
    try:
        c = s.client()
        for case in cases:
            kw = dict(model=s.model, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=TEMPERATURE,
                      seed=case.seed, stop=[case.stop], extra_body={"verbatim": {"cache": False}})
            full = c.chat.completions.create(**kw)
            assert full.choices[0].message.content == case.expected, case
            assert full.choices[0].finish_reason == "stop", case
            text, _, last, finish = collect_stream(c.chat.completions.create(stream=True, **kw))
            assert text == case.expected and finish == "stop", case
            assert last.verbatim["token_ids"] == full.verbatim["token_ids"], case
    finally:
        s.close()


def chat_cli(model: Path, stop: str, seed: int) -> str:
    """What `python -m engine chat` streams to stdout for one message (the prompts stripped)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONIOENCODING": "utf-8"}
    args = ["chat", "--model", str(model), "--seed", str(seed), "--temperature", str(TEMPERATURE), "--max-tokens",
            str(MAX_TOKENS), "--chunk", str(CHUNK), "--no-cache", "--stop", stop]
    proc = subprocess.run([sys.executable, "-m", "engine", *args], input=MESSAGES[0]["content"] + "\n/quit\n",
                          capture_output=True, text=True, encoding="utf-8", env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("you> ") and out.endswith("\nyou> "), out
    return out[len("you> ") : -len("\nyou> ")]


def test_cli_streams_and_prints_exactly_the_final_text(tiny_model: Path, tmp_path: Path, cases: list[Case]) -> None:
    """The reported stops, U+FFFD, and one completed by the last, incomplete character (seed 4's
    reply ends in one): `chat` streams, `generate` does not."""
    chosen = [Case(1, "fa ", "V]\ufffdie"), Case(1, "a S", "V]\ufffdief"), Case(1, "\ufffd", "V]"),
              next(c for c in cases if c.seed == 4 and c.stop.endswith("\ufffd"))]
    m = write(tmp_path, "chat.json", MESSAGES)
    for case in chosen:
        assert chat_cli(tiny_model, case.stop, case.seed) == case.expected, case
        proc = run_cli("generate", "--model", str(tiny_model), "--messages", str(m), "--seed", str(case.seed),
                       "--temperature", str(TEMPERATURE), "--max-tokens", str(MAX_TOKENS), "--chunk", str(CHUNK),
                       "--no-cache", "--stop", case.stop, "--json")
        out = json.loads(proc.stdout)
        assert out["text"] == case.expected and out["finish_reason"] == "stop", case
