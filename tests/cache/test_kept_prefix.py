"""A harness's prompt is prefilled once, ever (issue 47): a long system turn is kept warm like a
document's state.

Codex CLI and Claude Code open every session with the same thousands of tokens (system prompt and
tools). Where such a system turn ends (KEPT_SYSTEM_MIN tokens or more) the engine keeps a snapshot
of kind "document" naming no documents (engine/generate/prepare.py: kept_points): eviction keeps it
ahead of ordinary turns and a restart reads it ahead (Engine.preload_documents), so the next
session restores up to its own first message and prefills only its own tokens, from memory, also
after a restart, also on a family whose cache cannot be cut back (a wrapped sliding window), where
no other snapshot could serve it. A short system turn keeps nothing of its own.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from engine.engine import Engine
from engine.generate.prepare import KEPT_SYSTEM_MIN
from engine.types import GenerationRequest, SamplerSettings
from tests.engine_helpers import require_openblas

# A system prompt of ~1.5k tiny-tokenizer tokens, as a harness's is (in kind, not in size).
SYSTEM = " ".join(f"Rule {i}: answer briefly, explain how a prompt cache works, and regenerate the same tokens."
                  for i in range(40))


def ask(question: str, system: str = SYSTEM, **kw: Any) -> GenerationRequest:
    return GenerationRequest([{"role": "system", "content": system}, {"role": "user", "content": question}],
                             SamplerSettings(max_tokens=kw.pop("max_tokens", 6), temperature=1.0, seed=3), **kw)


def system_end(eng: Engine, system: str = SYSTEM) -> int:
    """Where the system turn ends in the prompt (the start of the first user message)."""
    return eng.prepare(ask("?", system)).message_starts[0]


def kept(eng: Engine) -> list[Any]:
    return [m for m in eng.cache.memory.metas() if m.kind == "document"]


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_a_second_session_restores_the_system_turn(models: dict[str, Path], family: str) -> None:
    """Two sessions with the same long system turn and different questions: the second restores
    exactly where its own question starts, and its reply equals its cold run. On gemma3 the
    sliding window has wrapped by then, so only the kept snapshot can serve that point."""
    require_openblas()
    eng = Engine(use_disk=False, chunk=16)
    eng.load(str(models[family]))
    try:
        end = system_end(eng)
        assert end >= KEPT_SYSTEM_MIN
        first = eng.generate(ask("Why is the sky blue?"))
        assert {"kind": "document", "length": end} in [{k: s[k] for k in ("kind", "length")}
                                                      for s in first.report.snapshots_stored]
        assert [(m.length, m.documents) for m in kept(eng)] == [(end, ())]
        question = ask("What is the capital of France?")
        second = eng.generate(question)
        assert second.report.restored == end and second.report.source == "memory"
        assert second.report.prefill_tokens == second.report.prompt_tokens - end
        cold = eng.generate(dataclasses.replace(question, use_cache=False))
        assert (second.tokens, second.logprobs) == (cold.tokens, cold.logprobs)
    finally:
        eng.close()


def test_after_a_restart_the_system_turn_is_read_ahead(models: dict[str, Path], tmp_path: Path) -> None:
    """The kept state goes to the disk like any snapshot; after a restart the read-ahead
    (preload_documents: `engine serve` and the window run it at start) brings it into memory, so
    the first session restores its system turn with no disk read when asked."""
    eng = Engine(cache_dir=tmp_path / "cache", chunk=16)
    eng.load(str(models["llama"]))
    end = system_end(eng)
    eng.generate(ask("Why is the sky blue?"))
    eng.close()
    eng = Engine(cache_dir=tmp_path / "cache", chunk=16)
    eng.load(str(models["llama"]))
    try:
        assert eng.preload_documents() == 1
        assert [(m.length, m.documents) for m in kept(eng)] == [(end, ())]
        loads = eng.cache.disk.stats()["loads"]
        r = eng.generate(ask("What is the capital of France?"))
        assert eng.cache.disk.stats()["loads"] == loads  # nothing read from the disk when asked
        assert r.report.restored == end and r.report.source == "disk"  # read ahead: its state came from there
    finally:
        eng.close()


def test_eviction_keeps_the_system_turn_ahead_of_ordinary_turns(models: dict[str, Path]) -> None:
    """A memory budget that holds the kept state and a few turns: after twenty other
    conversations, a new session still restores its system turn from memory."""
    eng = Engine(use_disk=False, chunk=16, memory_budget=8 << 20)
    eng.load(str(models["llama"]))
    try:
        end = system_end(eng)
        eng.generate(ask("Why is the sky blue?"))
        for i in range(20):
            eng.generate(GenerationRequest([{"role": "user", "content": f"{i}: " + "The quick brown fox. " * 20}],
                                           SamplerSettings(max_tokens=4)))
        assert eng.cache.stats()["memory_entries"] < 2 + 20  # the budget did bite: turns were dropped
        r = eng.generate(ask("What is the capital of France?"))
        assert r.report.restored == end and r.report.source == "memory"
    finally:
        eng.close()


def test_a_short_system_turn_keeps_nothing_of_its_own(models: dict[str, Path]) -> None:
    eng = Engine(use_disk=False, chunk=16)
    eng.load(str(models["llama"]))
    try:
        short = "You are a helpful assistant."
        assert system_end(eng, short) < KEPT_SYSTEM_MIN
        r = eng.generate(ask("Why is the sky blue?", short))
        assert not [s for s in r.report.snapshots_stored if s["kind"] == "document"] and not kept(eng)
    finally:
        eng.close()


def test_the_system_turn_is_every_leading_system_message(models: dict[str, Path]) -> None:
    """Codex CLI sends two developer (system) messages before the user's: both are its system turn."""
    eng = Engine(use_disk=False, chunk=16)
    eng.load(str(models["llama"]))
    try:
        two = [{"role": "system", "content": SYSTEM}, {"role": "system", "content": "Sandbox: read-only."}]

        def req(q: str) -> GenerationRequest:
            return GenerationRequest([*two, {"role": "user", "content": q}], SamplerSettings(max_tokens=4))

        end = eng.prepare(req("?")).message_starts[1]  # where the user's message starts
        eng.generate(req("Why is the sky blue?"))
        assert [(m.length, m.documents) for m in kept(eng)] == [(end, ())]
    finally:
        eng.close()
