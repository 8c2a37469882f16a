"""Three promises that no test checked: a bug planted in each left every test passing (issue 50,
item 9). Each test names the mutation of tests/mutation_check.py it catches.

- A reported logprob is the float32 log-softmax of that step's logits, computed here again,
  independently, from the logits the model returned (every other logprob test compares one run
  with another, so rounding both the same way passes).
- With two documents, the second gets its own cut and its own snapshot at its end.
- A document snapshot holding two documents of which only the first is still in use is kept like
  any in-use document's state (engine/cache/eviction.py, DocumentsKept).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterator

import mlx.core as mx
import numpy as np
import pytest

from engine.cache.eviction import DocumentsKept
from engine.cache.meta import SnapshotMeta
from engine.documents.extract import Document, document_from_bytes
from engine.engine import Engine
from engine.types import GenerationRequest, SamplerSettings
from tests.engine_helpers import make_engine, model_dir, request

SKY = [{"role": "user", "content": "Why is the sky blue? Explain it to me in a few sentences."}]
REPORT = "\n".join(f"Section {i}. The quick brown fox jumps over the lazy dog. Why is the sky blue? "
                   f"Because of Rayleigh scattering of sunlight in the atmosphere." for i in range(12))
APPENDIX = "The capital of France is Paris. The capital of Italy is Rome.\n" * 6
GLOSSARY = "Rayleigh scattering: light scattered by particles smaller than its wavelength.\n" * 3
SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}


def doc(text: str, name: str) -> Document:
    return document_from_bytes(name, text.encode())


def ask(question: str, docs: tuple[Document, ...], **kw: Any) -> GenerationRequest:
    return GenerationRequest([SYSTEM, {"role": "user", "content": question}],
                             SamplerSettings(max_tokens=kw.pop("max_tokens", 6), temperature=1.0, seed=3),
                             documents=docs, **kw)


# -- a reported logprob is the float32 log-softmax of its step's logits --------------------------


class LogitsLog:
    """Stands in for the model: forwards to it and keeps every forward's last-position logits."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.logits: list[mx.array] = []

    def __call__(self, x: mx.array, cache: Any = None) -> mx.array:
        out = self.inner(x, cache=cache)
        self.logits.append(out[0, -1, :])
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def log_softmax64(logits: np.ndarray) -> np.ndarray:
    """The log-softmax in float64, by hand: the reference the engine's float32 one is held to."""
    x = logits.astype(np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


@pytest.mark.parametrize("temperature, top_p", [(0.0, 1.0), (0.8, 0.9)])
def test_a_reported_logprob_is_the_log_softmax_of_its_steps_logits(tiny_model: Path, temperature: float,
                                                                    top_p: float) -> None:
    """mutations "a logprob rounded as it is reported", "logprobs of the tempered distribution"."""
    eng = make_engine(tiny_model, chunk=8)
    log = LogitsLog(eng.lm.model)
    eng.lm.model = log
    r = eng.generate(dataclasses.replace(request(SKY, max_tokens=24, temperature=temperature, top_p=top_p, seed=11),
                                         top_logprobs=3))
    assert len(r.tokens) == 24
    # Decode's forwards follow prefill's: the last prompt token's gives step 0's logits, and so on.
    first = len(r.report.chunks) - 1
    steps = log.logits[first:first + len(r.tokens)]
    for i, (logits, token, lp, top) in enumerate(zip(steps, r.tokens, r.logprobs, r.top_logprobs)):
        ref = log_softmax64(np.array(logits.astype(mx.float32)))
        assert logits.dtype == mx.float32
        assert np.float32(lp) == lp, f"step {i}: {lp!r} is no float32"
        assert abs(lp - ref[token]) <= 2e-6 * max(1.0, abs(ref[token])), (i, lp, ref[token])
        # The alternatives are the distribution's best, with their own log-softmax values.
        best = np.argsort(-ref, kind="stable")[:3]
        assert sorted(t for t, _ in top) == sorted(int(t) for t in best), i
        assert all(abs(v - ref[t]) <= 2e-6 * max(1.0, abs(ref[t])) for t, v in top), i
        if temperature == 0.0:
            assert token == int(np.argmax(ref)), i


# -- two documents: the second gets its own cut and its own snapshot -------------------------------


@pytest.mark.parametrize("family", ["llama", "lfm2"])
def test_the_second_of_two_documents_gets_its_own_cut_and_snapshot(tmp_path_factory: pytest.TempPathFactory,
                                                                    family: str) -> None:
    """A conversation about [a, b, c] restores the exact state at b's end that a conversation about
    [a, b] kept: for a cache that cannot be cut back (lfm2's SSM state) only the document snapshot
    taken exactly there can serve it. mutations "only the first document's end is a cut", "a
    document snapshot only at the first document's end"."""
    eng = Engine(use_disk=False, chunk=16)
    eng.load(str(model_dir(tmp_path_factory.mktemp("m"), family)))
    try:
        a, b, c = doc(REPORT, "a.md"), doc(APPENDIX, "b.txt"), doc(GLOSSARY, "c.txt")
        both = eng.generate(ask("Why is the sky blue?", (a, b))).report
        a_span, b_span = both.documents
        assert a_span["cut"] and b_span["cut"] and a_span["end"] < b_span["end"]
        ends = [end for _, end in both.chunks]
        assert a_span["end"] in ends and b_span["end"] in ends  # a forward ends at each document's end
        documents = [s["length"] for s in both.snapshots_stored if s["kind"] == "document"]
        assert a_span["end"] in documents and b_span["end"] in documents
        for m in [m for m in eng.cache.metas() if m.kind != "document"]:
            eng.cache.memory.drop(m.id)  # the turn's own snapshots: only the documents' are left
        three = ask("What is the capital of France?", (a, b, c))
        r = eng.generate(three)
        assert r.report.restored == b_span["end"] and [d["source"] for d in r.report.documents] == [
            "memory", "memory", "prefilled"]
        cold = eng.generate(dataclasses.replace(three, use_cache=False))
        assert (r.tokens, r.logprobs) == (cold.tokens, cold.logprobs)
    finally:
        eng.close()


# -- a document snapshot holding two documents, one still in use ----------------------------------


def meta(documents: tuple[str, ...], trimmable: bool) -> SnapshotMeta:
    return SnapshotMeta("s", "k" * 32, (1, 2, 3), "document", (), ("KVCache",), trimmable, 0, documents=documents)


def test_which_documents_keep_a_document_snapshot_ahead() -> None:
    """Kept ahead while a conversation could still restore it: a state that can be cut back serves
    every conversation that starts with its first document; one that cannot, only a conversation
    with all of them. mutations "a snapshot of two documents kept only while both are in use",
    "a snapshot of two documents kept while any of them is in use"."""
    policy = DocumentsKept({"a"})
    assert policy.keep_priority(meta(("a", "b"), trimmable=True)) == 1  # a's state is in it
    assert policy.keep_priority(meta(("a", "b"), trimmable=False)) == 0  # only [a, b] restores it
    assert DocumentsKept({"b"}).keep_priority(meta(("a", "b"), trimmable=True)) == 0  # no one starts with b after a
    assert DocumentsKept({"a", "b"}).keep_priority(meta(("a", "b"), trimmable=False)) == 1
    assert DocumentsKept(None).keep_priority(meta(("a", "b"), trimmable=False)) == 1
    assert DocumentsKept(set()).keep_priority(meta((), trimmable=False)) == 1  # names none: written before


@pytest.fixture()
def engine(llama: Path) -> Iterator[Engine]:
    eng = Engine(use_disk=False, chunk=16, memory_budget=3 << 20)
    eng.load(str(llama))
    yield eng
    eng.close()


def _turns(eng: Engine, tag: str) -> None:
    for i in range(20):
        eng.generate(ask(f"{tag} {i}: " + "The quick brown fox jumps over the lazy dog. " * 8, (), max_tokens=4))


@pytest.mark.parametrize("in_use, kept", [("a", True), ("b", False)])
def test_a_snapshot_of_two_documents_with_one_still_in_use(engine: Engine, in_use: str, kept: bool) -> None:
    """Both ways: the conversation about [a, b] is gone. With a still in use (another conversation
    has it), the state at a's end lives only inside the [a, b] snapshot (the smaller one was
    dropped as redundant): kept like any in-use document's state, a question about a restores it
    after twenty other turns. With only b in use, nothing can restore that state (b's comes after
    a's): it goes as a turn does. mutation "a snapshot of two documents kept only while both are
    in use"."""
    a, b = doc(REPORT, "a.md"), doc(APPENDIX, "b.txt")
    first = engine.generate(ask("Why is the sky blue?", (a, b))).report
    a_end = first.documents[0]["end"]
    held = [m for m in engine.cache.metas() if m.kind == "document"]
    assert [m.documents for m in held] == [(a.digest, b.digest)]  # a's own was dominated, dropped
    engine.keep_documents({a.digest if in_use == "a" else b.digest})
    _turns(engine, in_use)
    assert engine.cache.stats()["memory_entries"] < 1 + 20  # the budget did bite: turns were dropped
    r = engine.generate(ask("What is the capital of France?", (a,)))
    if kept:
        assert r.report.restored >= a_end and r.report.documents[0]["source"] == "memory"
    else:
        assert r.report.restored < a_end and r.report.documents[0]["source"] == "prefilled"
