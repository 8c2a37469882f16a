"""The request path (engine/generate/prepare.py): a request's prompt is rendered once, and the
loop takes the prepared request whole."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterator

import pytest

from engine.constraint import Constraint
from engine.documents.extract import Document
from engine.engine import Engine
from engine.generate.loop import drain, stream
from engine.generate.templating import render
from engine.types import GenerationRequest, SamplerSettings

WEATHER = {"type": "function", "function": {"name": "weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
REPORT = Document(name="report.txt", text="The quick brown fox jumps over the lazy dog. " * 12,
                  digest="d" * 64, kind="text")
CHAT = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Why is the sky blue?"},
        {"role": "assistant", "content": "Because of Rayleigh scattering."},
        {"role": "user", "content": "Explain how a prompt cache works."}]


@pytest.fixture(scope="module")
def engine(tool_model: Path) -> Iterator[Engine]:
    eng = Engine(use_disk=False, chunk=8, context_length=2048)
    eng.load(str(tool_model))
    yield eng
    eng.close()


@pytest.fixture
def applications(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bool]]:
    """One entry per application of the chat template: (messages it got, with the generation prompt)."""
    hf = engine.lm.tokenizer._tokenizer
    calls: list[tuple[int, bool]] = []
    original = hf.apply_chat_template

    def counted(messages: Any, *args: Any, **kw: Any) -> Any:
        calls.append((len(messages), bool(kw.get("add_generation_prompt"))))
        return original(messages, *args, **kw)

    monkeypatch.setattr(hf, "apply_chat_template", counted)
    return calls


def full_request() -> GenerationRequest:
    """A chat with a document, tools and a default max_tokens (fitted to the room left): every
    step of the path that used to render the prompt again has something to do."""
    return GenerationRequest([dict(m) for m in CHAT], SamplerSettings(max_tokens=64), documents=(REPORT,),
                             constraint=Constraint.of([WEATHER], "auto"), max_tokens_fit=True)


def test_a_prepared_request_renders_its_prompt_once(engine: Engine, applications: list[tuple[int, bool]]) -> None:
    """Preparing renders the whole prompt (the conversation with the generation prompt) once; the
    prefixes whose starts it needs (without it) are memoized, so preparing the same request again
    applies the template exactly once, and the render it did is the prompt it returns."""
    first = engine.prepare(full_request())
    assert applications.count((len(CHAT), True)) == 1
    applications.clear()
    again = engine.prepare(full_request())
    assert applications == [(len(CHAT), True)]
    assert again == first
    whole = render(engine.lm.tokenizer, first.request.messages, tools=[WEATHER])
    assert first.prompt == whole.ids
    assert first.documents and first.documents[0].cut and first.document_points


def test_measure_renders_once_and_counts_what_prepare_sends(engine: Engine,
                                                           applications: list[tuple[int, bool]]) -> None:
    req = full_request()
    info = engine.measure(req)
    assert applications == [(len(CHAT), True)]
    assert info.prompt_tokens == len(engine.prepare(req).prompt)


def test_the_loop_runs_the_prepared_request_as_given(engine: Engine) -> None:
    """loop.stream reads everything from the Prepared: a schedule without the message starts is
    forwarded without them (a cold run's chunks follow the Prepared, not a fresh render), and
    the report carries the documents' spans the Prepared found."""
    p = engine.prepare(full_request())
    cold = dataclasses.replace(p, request=dataclasses.replace(p.request, use_cache=False))
    with_starts = drain(stream(engine.lm, cold, None, engine.chunk, None, engine.builder.guide(p)))
    without = drain(stream(engine.lm, dataclasses.replace(cold, message_starts=[]), None, engine.chunk, None,
                           engine.builder.guide(p)))
    ends = {c[1] for c in with_starts.report.chunks}
    assert set(p.message_starts) - {len(p.prompt) - 1} <= ends
    assert not {m for m in p.message_starts if m % engine.chunk} & {c[1] for c in without.report.chunks}
    assert [d["end"] for d in with_starts.report.documents] == [s.end for s in p.documents]
    assert with_starts.report.context == p.context
