"""Documents in the chat (issue 38), engine side: files read as text, placed where every
conversation about them shares their state, restored bit-exactly from memory and disk, refused
with the file's name, recorded in receipts, sent by the CLI and the server's `file` parts."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from engine.cli.main import main as cli
from engine.documents import extract
from engine.documents.bounded import read_file
from engine.documents.extract import Document, DocumentError, document_from_bytes
from engine.documents.placement import block, place
from engine.engine import Engine
from engine.errors import RequestError
from engine.generate.templating import render_prompt
from engine.receipts import Receipt, ReceiptError, ReceiptModel, build
from engine.types import GenerationRequest, SamplerSettings
from tests.document_files import APPENDIX, REPORT, docx_bytes, file_part, pdf_bytes
from tests.engine_helpers import model_dir

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}






def doc(text: str = REPORT, name: str = "report.md") -> Document:
    return document_from_bytes(name, text.encode())


def ask(question: str, docs: tuple[Document, ...], mode: str = "exact", **kw: Any) -> GenerationRequest:
    return GenerationRequest([SYSTEM, {"role": "user", "content": question}],
                             SamplerSettings(max_tokens=kw.pop("max_tokens", 8), temperature=kw.pop("temperature", 1.0),
                                             seed=kw.pop("seed", 3)), mode=mode, documents=docs, **kw)


def system_end(eng: Engine, docs: tuple[Document, ...]) -> int:
    """Where the first message after the documents starts: the system message holding them,
    rendered alone (SYSTEM is every test conversation's system prompt)."""
    return len(render_prompt(eng.lm.tokenizer, place([SYSTEM], docs), add_generation_prompt=False))


# -- reading files -----------------------------------------------------------------------------


def test_text_markdown_and_source_are_read_as_they_are(tmp_path: Path) -> None:
    for name, text in (("notes.txt", "plain\r\nlines  \r\n"), ("README.md", "# Title\n\n- a\n- b\n"),
                       ("add.py", "def add(a, b):\n    return a + b\n")):
        (tmp_path / name).write_bytes(text.encode())
        d = read_file(tmp_path / name)
        assert (d.name, d.kind, d.pages) == (name, "text", None)
        assert d.text == text.replace("\r\n", "\n").replace("  \n", "\n").strip("\n")
        assert d.digest == hashlib.sha256(text.encode()).hexdigest()  # of the file's bytes, as stored


def test_a_pdf_is_read_page_by_page_and_a_docx_with_its_tables(tmp_path: Path) -> None:
    (tmp_path / "paper.pdf").write_bytes(pdf_bytes(["First page: the quick brown fox.", "Second page: Paris."]))
    d = read_file(tmp_path / "paper.pdf")
    assert (d.kind, d.pages) == ("pdf", 2)
    assert d.text.split("\n\n") == ["First page: the quick brown fox.", "Second page: Paris."]
    (tmp_path / "contract.docx").write_bytes(docx_bytes(["Clause 1. Pay on time.", "Clause 2."],
                                                         [["Party", "Role"], ["Ann", "Buyer"]]))
    d = read_file(tmp_path / "contract.docx")
    assert d.kind == "docx" and d.text == "Clause 1. Pay on time.\nClause 2.\nParty | Role\nAnn | Buyer"


@pytest.mark.parametrize("case", ["encrypted", "broken pdf", "broken docx", "binary", "empty", "scanned", "too large"])
def test_a_file_that_cannot_be_a_document_is_refused_naming_it(tmp_path: Path, case: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    name, data, why = {
        "encrypted": ("secret.pdf", pdf_bytes(["hidden"], password="pw"), "encrypted"),
        "broken pdf": ("cut.pdf", pdf_bytes(["text"])[:200], "not a readable PDF"),
        "broken docx": ("cut.docx", docx_bytes(["x"], [["a"]])[:300], "not a readable .docx"),
        "binary": ("blob.bin", bytes(range(256)) * 64, "not text"),
        "empty": ("empty.txt", b"", "empty"),
        "scanned": ("scan.pdf", pdf_bytes([""]), "no text"),
        "too large": ("big.txt", b"x" * 4096, "too large"),
    }[case]
    if case == "too large":
        monkeypatch.setattr(extract, "MAX_FILE_BYTES", 1024)
    (tmp_path / name).write_bytes(data)
    with pytest.raises(DocumentError) as e:
        read_file(tmp_path / name)
    assert str(e.value).startswith(f"{name}: ") and why in str(e.value), str(e.value)
    assert isinstance(e.value, RequestError)  # a 400 through the server, a clear line in the CLI


def test_the_media_type_decides_over_the_name() -> None:
    """A PDF's extracted text sent as text/plain (what a remote engine sends) is read as text."""
    text = document_from_bytes("paper.pdf", b"First page.\n\nSecond page.", "text/plain")
    assert (text.kind, text.text) == ("text", "First page.\n\nSecond page.")


# -- placement -------------------------------------------------------------------------------


def test_documents_go_at_the_end_of_the_system_message_in_attach_order() -> None:
    a, b = doc(REPORT, "a.md"), doc(APPENDIX, "b.txt")
    user = {"role": "user", "content": "Q?"}
    assert place([SYSTEM, user], [a, b]) == [
        {"role": "system", "content": SYSTEM["content"] + "\n\n" + block(a) + "\n\n" + block(b)}, user]
    assert place([user], [a]) == [{"role": "system", "content": block(a)}, user]  # no system prompt: one is made
    assert place([{"role": "system", "content": ""}, user], [a]) == [{"role": "system", "content": block(a)}, user]
    assert block(a).startswith('<document name="a.md">\n') and block(a).endswith("\n</document>")


# -- the cache: read once, shared by every conversation ----------------------------------------


def test_a_new_conversation_about_the_same_document_restores_it_and_equals_a_cold_run(engine: Engine) -> None:
    d = doc()
    first = engine.generate(ask("Why is the sky blue?", (d,)))
    span = first.report.documents[0]
    assert span["name"] == "report.md" and span["cut"] and span["tokens"] > 200 and span["source"] == "prefilled"
    assert any(s["kind"] == "document" and s["length"] == span["end"] for s in first.report.snapshots_stored)
    other = ask("What is the capital of France?", (d,))
    second = engine.generate(other)
    assert second.report.restored >= span["end"] and second.report.source == "memory"
    assert second.report.documents[0] | {"source": "memory"} == span | {"source": "memory"}
    assert second.report.documents[0]["source"] == "memory"
    assert second.report.prefill_tokens == second.report.prompt_tokens - second.report.restored
    cold = engine.generate(dataclasses.replace(other, use_cache=False))
    assert (second.tokens, second.logprobs) == (cold.tokens, cold.logprobs)


def test_a_document_snapshot_is_kept_where_the_next_message_starts_too(engine: Engine) -> None:
    """What lies between the last document's end and the next message is the template's closing
    of the system message, the same in every conversation about the document: the state there is
    kept as a document snapshot too (the one read ahead after a restart), so a new conversation
    forwards from its own first message on, not those few tokens first."""
    d = doc()
    first = engine.generate(ask("Why is the sky blue?", (d,)))
    end, at = first.report.documents[0]["end"], system_end(engine, (d,))
    assert end < at < end + 8
    assert [s["length"] for s in first.report.snapshots_stored if s["kind"] == "document"] == [end, at]
    held = [m for m in engine.cache.memory.metas() if m.kind == "document"]
    assert [(m.length, m.documents) for m in held] == [(at, (d.digest,))]  # it serves the end too (cut back)
    for m in [m for m in engine.cache.memory.metas() if m.kind != "document"]:
        engine.cache.memory.drop(m.id)  # the turn's own snapshots (they cut there too): only the document's left
    second = engine.generate(ask("What is the capital of France?", (d,)))
    assert second.report.restored == at and second.report.chunks[0][0] == at


def test_a_regenerate_about_a_document_restores_all_but_the_last_token_and_is_identical(engine: Engine) -> None:
    req = ask("Why is the sky blue?", (doc(),))
    a = engine.generate(req)
    b = engine.generate(req)
    assert b.report.restored == b.report.prompt_tokens - 1 and b.report.prefill_tokens == 1
    assert (b.tokens, b.logprobs) == (a.tokens, a.logprobs) and b.report.identical is True


def test_the_first_of_two_documents_is_shared_with_a_conversation_about_it_alone(engine: Engine) -> None:
    """Each document's end is a cut: a conversation about [a, b] holds the exact state at a's end."""
    a, b = doc(REPORT, "a.md"), doc(APPENDIX, "b.txt")
    both = engine.generate(ask("Why is the sky blue?", (a, b)))
    a_end = both.report.documents[0]["end"]
    assert both.report.documents[0]["cut"] and a_end < both.report.documents[1]["start"] + 2
    alone_req = ask("Why is the sky blue?", (a,))
    alone = engine.generate(alone_req)
    assert alone.report.restored == a_end and alone.report.documents[0]["source"] == "memory"
    cold = engine.generate(dataclasses.replace(alone_req, use_cache=False))
    assert (alone.tokens, alone.logprobs) == (cold.tokens, cold.logprobs)


@pytest.mark.parametrize("family", ["gemma3", "lfm2"])
def test_a_cache_that_cannot_be_cut_back_shares_the_document_through_its_snapshot(
        tmp_path_factory: pytest.TempPathFactory, family: str) -> None:
    """Sliding-window and SSM caches can only be restored where a snapshot was taken: the
    document snapshot at its end is what a new conversation restores."""
    eng = Engine(use_disk=False, chunk=16)
    eng.load(str(model_dir(tmp_path_factory.mktemp("m"), family)))
    try:
        d = doc(APPENDIX)
        first = eng.generate(ask("Why is the sky blue?", (d,)))
        end = first.report.documents[0]["end"]
        other = ask("What is the capital of France?", (d,))
        second = eng.generate(other)
        # Up to where the system message rendered alone ends, past the document's end (the
        # template's own closing of it, or Gemma's "\n\n" before the first user turn's text).
        at = system_end(eng, (d,))
        assert at > end and second.report.restored == at
        assert second.report.documents[0]["source"] == "memory"
        cold = eng.generate(dataclasses.replace(other, use_cache=False))
        assert (second.tokens, second.logprobs) == (cold.tokens, cold.logprobs)
    finally:
        eng.close()


def test_after_a_restart_a_new_conversation_restores_the_document_from_disk(llama: Path, tmp_path: Path) -> None:
    d = doc()
    eng = Engine(cache_dir=tmp_path / "cache", chunk=16)
    eng.load(str(llama))
    end = eng.generate(ask("Why is the sky blue?", (d,))).report.documents[0]["end"]
    eng.close()
    eng = Engine(cache_dir=tmp_path / "cache", chunk=16)
    eng.load(str(llama))
    try:
        other = ask("What is the capital of France?", (d,))
        r = eng.generate(other)
        assert r.report.source == "disk" and r.report.restored >= end
        assert r.report.documents[0]["source"] == "disk"
        cold = eng.generate(dataclasses.replace(other, use_cache=False))
        assert (r.tokens, r.logprobs) == (cold.tokens, cold.logprobs)
    finally:
        eng.close()


def test_after_a_restart_the_documents_states_are_preloaded_and_the_first_question_reads_no_disk(
    llama: Path, tmp_path: Path
) -> None:
    """preload_documents (the window runs it once a model is loaded) reads the kept document's
    state from the disk into memory: the first question after the restart loads nothing more from
    the disk, still says its state came from there, and equals its cold run. A document no
    conversation has is not read ahead."""
    d, other_doc = doc(), doc(APPENDIX, "appendix.md")
    eng = Engine(cache_dir=tmp_path / "cache", chunk=16)
    eng.load(str(llama))
    end = eng.generate(ask("Why is the sky blue?", (d,))).report.documents[0]["end"]
    eng.generate(ask("Why is the sky blue?", (other_doc,)))
    eng.close()
    eng = Engine(cache_dir=tmp_path / "cache", chunk=16)
    eng.load(str(llama))
    try:
        eng.keep_documents({d.digest})  # the appendix is in no conversation any more
        assert eng.preload_documents() == 1
        assert [m.documents for m in eng.cache.memory.metas()] == [(d.digest,)]
        loads, spares = eng.cache.disk.stats()["loads"], eng.cache.stats()["spare_hits"]
        question = ask("What is the capital of France?", (d,))
        r = eng.generate(question)
        assert eng.cache.disk.stats()["loads"] == loads  # nothing read from the disk when asked
        # Restored up to the question's own message, from the copy made ahead (no copy when asked):
        assert r.report.restored == system_end(eng, (d,)) > end and r.report.documents[0]["source"] == "disk"
        assert eng.cache.stats()["spare_hits"] == spares + 1
        cold = eng.generate(dataclasses.replace(question, use_cache=False))
        assert (r.tokens, r.logprobs) == (cold.tokens, cold.logprobs)
        again = eng.generate(ask("And of Italy?", (d,)))
        assert again.report.documents[0]["source"] == "memory"  # read ahead once; from memory since
    finally:
        eng.close()


def test_eviction_keeps_the_document_ahead_of_ordinary_turns(llama: Path) -> None:
    """A memory budget that holds the document's state and a few turns: twenty conversations
    without it later, a new question about the document still restores it."""
    d = doc()
    eng = Engine(use_disk=False, chunk=16, memory_budget=3 << 20)
    eng.load(str(llama))
    try:
        first = eng.generate(ask("Why is the sky blue?", (d,)))
        end = first.report.documents[0]["end"]
        for i in range(20):
            eng.generate(ask(f"{i}: " + "The quick brown fox jumps over the lazy dog. " * 8, (), max_tokens=4))
        assert eng.cache.stats()["memory_entries"] < 1 + 20  # the budget did bite: turns were dropped
        r = eng.generate(ask("What is the capital of France?", (d,)))
        assert r.report.restored >= end and r.report.documents[0]["source"] == "memory"
    finally:
        eng.close()


def test_a_document_no_conversation_has_any_more_is_evicted_like_a_turn(llama: Path, tmp_path: Path) -> None:
    """The same budget and turns as above, but the app has said the document is in no
    conversation any more (keep_documents): its state goes as an ordinary turn's does. The
    snapshot names the document it holds, on disk too."""
    d = doc()
    eng = Engine(use_disk=False, chunk=16, memory_budget=3 << 20)
    eng.load(str(llama))
    try:
        first = eng.generate(ask("Why is the sky blue?", (d,)))
        end = first.report.documents[0]["end"]
        held = [e.meta for e in eng.cache.memory._items.values() if e.meta.kind == "document"]
        assert [m.documents for m in held] == [(d.digest,)]
        eng.keep_documents({"0" * 64})  # another document is in use; this one is not
        for i in range(20):
            eng.generate(ask(f"{i}: " + "The quick brown fox jumps over the lazy dog. " * 8, (), max_tokens=4))
        r = eng.generate(ask("What is the capital of France?", (d,)))
        assert r.report.restored < end and r.report.documents[0]["source"] == "prefilled"
        eng.keep_documents({d.digest})  # in use again: kept ahead again
        for i in range(20):
            eng.generate(ask(f"{i} again: " + "The quick brown fox jumps over the lazy dog. " * 8, (), max_tokens=4))
        r = eng.generate(ask("And of Italy?", (d,)))
        assert r.report.restored >= end and r.report.documents[0]["source"] == "memory"
    finally:
        eng.close()
    from engine.cache.disk.format import meta_from_dict, meta_to_dict

    meta = held[0]
    assert meta_from_dict(meta_to_dict(meta)).documents == (d.digest,)
    bad = {**meta_to_dict(meta), "documents": ["../../etc/passwd"]}
    with pytest.raises(ValueError, match="bad documents"):
        meta_from_dict(bad)
    old = {k: v for k, v in meta_to_dict(meta).items() if k != "documents"}  # a pack written before
    assert meta_from_dict(old).documents == ()


def test_documents_that_cannot_fit_are_refused_before_any_prefill_with_the_numbers(llama: Path) -> None:
    eng = Engine(use_disk=False, chunk=16, context_length=256)
    eng.load(str(llama))
    try:
        with pytest.raises(RequestError) as e:
            eng.generate(ask("Why?", (doc(),), max_tokens=32))
        msg = str(e.value)
        assert e.value.param == "documents" and "report.md" in msg and "256" in msg and "at most 224 fit" in msg
        assert eng.cache.stats()["lookups"] == 0  # nothing was looked up, nothing prefilled
    finally:
        eng.close()


# -- receipts --------------------------------------------------------------------------------


def test_a_receipt_records_the_documents_and_verify_replays_it(engine: Engine, llama: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    raw = REPORT.encode()
    d = document_from_bytes("report.md", raw)
    req = ask("Why is the sky blue?", (d,), max_tokens=12)
    result = engine.generate(req)
    receipt = build(req, result, ReceiptModel(str(llama), engine.info.key, "llama"), engine.chunk)
    data = receipt.to_dict()
    assert data["version"] == 3 and data["messages"] == req.messages  # the conversation as written
    assert data["documents"] == [{"name": "report.md", "digest": hashlib.sha256(raw).hexdigest(), "kind": "text",
                                  "pages": None, "text": d.text,
                                  "text_sha256": hashlib.sha256(d.text.encode()).hexdigest()}]
    assert Receipt.from_dict(json.loads(json.dumps(data))).documents == (d,)

    def verify(doc_: dict, name: str) -> tuple[int, str]:
        (tmp_path / name).write_text(json.dumps(doc_))
        capsys.readouterr()
        code = cli(["verify", str(tmp_path / name), "--no-cache"])
        return code, capsys.readouterr().out

    code, out = verify(data, "r.json")
    assert code == 0 and out.startswith("OK"), out
    edited = json.loads(json.dumps(data))
    edited["documents"][0]["text"] = d.text.replace("fox", "cat")
    with pytest.raises(ReceiptError, match="does not match its text_sha256"):
        Receipt.from_dict(edited)
    gone = {k: v for k, v in data.items() if k != "documents"}
    with pytest.raises(ReceiptError, match="records documents"):
        Receipt.from_dict(gone)
    code, out = verify({**gone, "version": 1}, "without.json")  # the same conversation without its file
    assert code == 1 and out.startswith("MISMATCH"), out


# -- the CLI ---------------------------------------------------------------------------------


def test_generate_attach_places_the_file_and_a_bad_one_is_refused_before_loading(
        llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "q.json").write_text(json.dumps([SYSTEM, {"role": "user", "content": "Why is the sky blue?"}]))
    (tmp_path / "paper.pdf").write_bytes(pdf_bytes([REPORT[:400], APPENDIX]))
    args = ["generate", "--model", str(llama), "--messages", str(tmp_path / "q.json"), "--max-tokens", "4",
            "--no-cache", "--json", "--attach", str(tmp_path / "paper.pdf")]
    assert cli(args) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (span,) = out["cache"]["documents"]
    assert span["name"] == "paper.pdf" and span["cut"] and span["tokens"] > 100
    (tmp_path / "locked.pdf").write_bytes(pdf_bytes(["x"], password="pw"))
    assert cli(args[:-1] + [str(tmp_path / "locked.pdf"), "--model", str(tmp_path / "no-such-model")]) == 2
    err = capsys.readouterr().err
    assert "locked.pdf: the PDF is encrypted" in err  # refused before the (missing) model was looked at


# -- the server ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.server_helpers import Server

    s = Server(llama, tmp_path_factory.mktemp("doc-cache"), chunk=16)
    yield s
    s.close()


def test_the_server_reads_file_parts_and_a_new_conversation_starts_from_the_document(server: Any) -> None:
    pdf = pdf_bytes([REPORT[:500], APPENDIX])

    def chat(question: str) -> Any:
        return server.client().chat.completions.create(
            model=server.model, max_tokens=6, temperature=1.0, seed=2,
            messages=[SYSTEM, {"role": "user", "content": [file_part("paper.pdf", pdf, "application/pdf"),
                                                          {"type": "text", "text": question}]}])

    first = chat("Why is the sky blue?")
    (span,) = first.verbatim["documents"]
    assert span["name"] == "paper.pdf" and span["digest"] == hashlib.sha256(pdf).hexdigest()
    assert span["source"] == "prefilled" and span["cut"]
    second = chat("What is the capital of France?")
    assert second.verbatim["restored"] >= span["end"] and second.verbatim["documents"][0]["source"] == "memory"
    assert second.usage.prompt_tokens_details.cached_tokens == second.verbatim["restored"]
    # The same conversation through the engine directly, cold: the same tokens.
    doc_ = document_from_bytes("paper.pdf", pdf)
    cold = server.engine(lambda e: e.generate(GenerationRequest(
        [SYSTEM, {"role": "user", "content": "What is the capital of France?"}],
        SamplerSettings(max_tokens=6, temperature=1.0, seed=2), use_cache=False, documents=(doc_,))))
    assert second.verbatim["token_ids"] == cold.tokens


@pytest.mark.parametrize("part, says", [
    (file_part("locked.pdf", pdf_bytes(["x"], password="pw"), "application/pdf"), "locked.pdf: the PDF is encrypted"),
    (file_part("blob.bin", bytes(range(256)) * 64, "application/octet-stream"), "blob.bin: "),
    ({"type": "file", "file": {"filename": "a.txt", "file_data": "data:text/plain;base64,@@@"}}, "a.txt: "),
    ({"type": "file", "file": {"file_id": "file-123"}}, "no Files API"),
])
def test_a_bad_file_part_is_a_400_naming_the_file(server: Any, part: dict, says: str) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        server.client().chat.completions.create(model=server.model, max_tokens=4,
                                                messages=[{"role": "user", "content": [part, {"type": "text",
                                                                                             "text": "Q?"}]}])
    assert says in e.value.body["message"] and "messages[0].content[0]" in (e.value.body.get("param") or "")


def test_measure_counts_the_documents_locally_and_through_a_server(engine: Engine, server: Any) -> None:
    """What the context meter counts before Send: the prompt with its documents placed."""
    from engine.remote import RemoteEngine

    req = ask("Why is the sky blue?", (doc(),))
    alone = engine.measure(dataclasses.replace(req, documents=())).prompt_tokens
    with_doc = engine.measure(req).prompt_tokens
    ran = engine.generate(req).report.prompt_tokens
    assert with_doc == ran > alone + 200
    remote = RemoteEngine(server.url.removesuffix("/v1"))
    remote.load()
    assert remote.measure(req).prompt_tokens == with_doc
    # And a generation through the server: the documents travel as text parts, the reply is the
    # local cold run's, and the server reports where each document lies.
    got = remote.generate(req)
    cold = engine.generate(dataclasses.replace(req, use_cache=False))
    assert (got.tokens, got.logprobs) == (cold.tokens, cold.logprobs)
    assert got.report.documents[0]["name"] == "report.md" and got.report.documents[0]["cut"]
