"""One count for a document, defined once (issue 50, item 6): what a document costs is the tokens
its part of the system message takes (its named block and the separator before it). The refusal,
the report's span and `Engine.document_tokens` (what the window's chip shows) give the same number
for the same file, also on a server and for a template that adds its own default system prompt."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from engine.documents.extract import Document, document_from_bytes
from engine.engine import Engine
from engine.errors import RequestError
from engine.types import GenerationRequest, SamplerSettings
from tests.engine_helpers import model_dir

REPORT = "\n".join(f"Section {i}. The quick brown fox jumps over the lazy dog. Why is the sky blue?" for i in range(8))
NOTES = "The capital of France is Paris. The capital of Italy is Rome.\n" * 4
SYSTEM = "You are a helpful assistant. Answer briefly."


def doc(text: str, name: str) -> Document:
    return document_from_bytes(name, text.encode())


DOCS = (doc(REPORT, "report.md"), doc(NOTES, "notes.txt"))


def ask(docs: tuple[Document, ...], system: str, **kw: Any) -> GenerationRequest:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": "Why?"}]
    return GenerationRequest(messages, SamplerSettings(max_tokens=4), documents=docs, **kw)


def refused_sizes(eng: Any, req: GenerationRequest) -> dict[str, int]:
    """The per-document sizes a refusal names ('report.md 123, notes.txt 45')."""
    n = eng.measure(req).prompt_tokens
    with pytest.raises(RequestError) as e:
        eng.generate(dataclasses.replace(req, context_length=n - 20))
    listed = re.search(r"\(([^()]*)\); the context holds", str(e.value))
    assert listed, str(e.value)
    return {name: int(size.replace(",", "")) for name, size in (p.rsplit(" ", 1) for p in listed.group(1).split(", "))}


def spans(eng: Any, req: GenerationRequest) -> dict[str, int]:
    return {d["name"]: d["tokens"] for d in eng.generate(req).report.documents}


@pytest.mark.parametrize("system", [SYSTEM, ""], ids=["system-prompt", "no-system-prompt"])
def test_the_refusal_the_report_and_the_chip_count_a_document_alike(engine: Engine, system: str) -> None:
    req = ask(DOCS, system)
    chip = dict(zip((d.name for d in DOCS), engine.document_tokens(DOCS, system)))
    assert chip == spans(engine, req) == refused_sizes(engine, req)
    # Each count is what the document adds to the prompt: the placed conversation without it is
    # that many tokens shorter (the documents after the first one: nothing else changes there).
    without_notes = engine.measure(dataclasses.replace(req, documents=DOCS[:1])).prompt_tokens
    assert engine.measure(req).prompt_tokens - without_notes == chip["notes.txt"]
    # One document alone: its chip is the span it gets in the conversation about it alone.
    alone = ask(DOCS[:1], system)
    assert engine.document_tokens(DOCS[:1], system) == [spans(engine, alone)["report.md"]]


def test_a_template_with_a_default_system_prompt_counts_the_document_alike(tmp_path: Path) -> None:
    """SmolLM2's template adds its own system prompt when a conversation has none; a document then
    replaces it, so "the prompt with it minus without it" is smaller than the document (the chip
    said 680 where the refusal and the debug panel said 696)."""
    folder = model_dir(tmp_path, "llama")
    cfg = folder / "tokenizer_config.json"
    data = json.loads(cfg.read_text())
    data["chat_template"] = (
        "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful AI assistant named "
        "Tiny, trained by nobody in particular, and happy to help<|im_end|>\n{% endif %}" + data["chat_template"])
    cfg.write_text(json.dumps(data))
    eng = Engine(use_disk=False, chunk=16)
    eng.load(str(folder))
    try:
        req = ask(DOCS[:1], "")
        with_minus_without = (eng.measure(req).prompt_tokens
                              - eng.measure(dataclasses.replace(req, documents=())).prompt_tokens)
        (chip,) = eng.document_tokens(DOCS[:1], "")
        assert with_minus_without < chip  # what the old chip counted: the default prompt's tokens fewer
        assert {"report.md": chip} == spans(eng, req) == refused_sizes(eng, req)
    finally:
        eng.close()


def test_a_server_counts_a_document_as_the_engine_does(engine: Engine, llama: Path) -> None:
    from engine.remote import RemoteEngine
    from tests.server_helpers import Server

    server = Server(llama, None, chunk=16)
    try:
        remote = RemoteEngine(server.url.removesuffix("/v1"))
        remote.load()
        assert remote.document_tokens(DOCS, SYSTEM) == engine.document_tokens(DOCS, SYSTEM)
        got = remote.generate(ask(DOCS, SYSTEM))
        assert [d["tokens"] for d in got.report.documents] == engine.document_tokens(DOCS, SYSTEM)
    finally:
        server.close()
