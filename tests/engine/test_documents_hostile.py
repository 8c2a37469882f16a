"""Files that cannot hurt the server, and documents read whole (issue 49): hostile PDFs and .docx
files are refused within limits by a reader process that is killed past them, while the server
answers everyone else; Word documents are read in document order with every construct that
carries text, and what is not read is named; binary content is found anywhere in a file; one
limit on documents per request; file names shown escaped. The hostile files are built here
(tests/hostile_files.py)."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from engine.cli.main import main as cli
from engine.documents import bounded
from engine.documents.bounded import Limits, read_bytes
from engine.documents.document import MAX_DOCUMENTS, DocumentError, shown_name
from engine.documents.extract import document_from_bytes
from engine.documents.placement import place
from engine.errors import RequestError
from engine.types import GenerationRequest, SamplerSettings
from tests import hostile_files as H
from tests.document_files import APPENDIX, REPORT, docx_bytes, file_part, pdf_bytes

TIMEOUT = 120.0
QUICK = Limits(seconds=60, page_seconds=0.25, memory=1 << 30)  # a hostile page takes PDFium seconds


# -- Word: every construct that carries text, in document order ---------------------------------


@pytest.mark.parametrize("construct", H.corpus(), ids=lambda c: c.name)
def test_every_word_construct_is_read_as_word_shows_it(construct: H.Construct) -> None:
    doc = read_bytes(f"{construct.name}.docx", construct.data)
    for shown in construct.shown:
        assert shown in doc.text, (construct.name, doc.text)
    for hidden in construct.not_shown:
        assert hidden not in doc.text, (construct.name, doc.text)
    assert set(construct.unread) <= set(doc.unread), doc.unread


def test_a_word_document_is_read_in_document_order() -> None:
    """Paragraphs, a table and the paragraph after it, as they come (python-docx gave every
    paragraph first, then the tables)."""
    data = H.word(H.p("Before the table.") + H.table(["A", "B"], ["C", H.table(["D1", "D2"])])
                  + H.p("After the table."))
    assert read_bytes("order.docx", data).text == "Before the table.\nA | B\nC | D1 | D2\nAfter the table."


def test_what_a_word_document_holds_and_is_not_read_is_named() -> None:
    data = H.word(H.p("Text.", "<m:oMath><m:r><m:t>x</m:t></m:r></m:oMath>",
                      '<w:r><w:commentReference w:id="1"/></w:r>', '<w:r><w:commentReference w:id="2"/></w:r>'))
    doc = read_bytes("notes.docx", data)
    assert doc.unread == ("2 comments", "1 equation")
    assert doc.to_dict()["unread"] == ["2 comments", "1 equation"]  # kept with the message, and in receipts


# -- hostile files: refused by a reader killed at its limits ------------------------------------


@pytest.mark.parametrize("case", ["text lines pdf", "no-op pdf", "zip bomb docx", "empty paragraphs docx"])
def test_each_hostile_file_is_refused_within_the_limits(case: str) -> None:
    name, data, says = {
        "text lines pdf": ("lines.pdf", H.pdf_of_text_lines(), ("took more than", "MiB of memory")),
        "no-op pdf": ("noop.pdf", H.pdf_of_no_ops(), ("a page took more than 0.25 s",)),
        "zip bomb docx": ("bomb.docx", H.docx_inflating_to(300 << 20), ("inflates to 300 MiB",)),
        "empty paragraphs docx": ("paras.docx", H.docx_of_empty_paragraphs(), ("has no text",)),
    }[case]
    with pytest.raises(DocumentError) as e:
        read_bytes(name, data, None, QUICK)
    assert str(e.value).startswith(f"{name}: ") and any(s in str(e.value) for s in says), str(e.value)


def test_a_pdf_whose_page_holds_more_text_than_the_budget_is_refused_before_its_text_is_made() -> None:
    data = H.pdf_of_text_lines(lines=2_000, width=90)  # 180,000 characters on one page
    with pytest.raises(DocumentError, match="too much text"):
        read_bytes("big.pdf", data, None, Limits(seconds=60, page_seconds=60, memory=1 << 30, chars=100_000))
    assert len(read_bytes("big.pdf", data, None, QUICK).text) >= 180_000  # within the budget: read


class _Spawned:
    """The reader processes bounded.py starts, with the command a test gives them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, command: list[str]) -> None:
        self.procs: list[subprocess.Popen] = []
        self.started = threading.Event()
        real = subprocess.Popen

        def popen(_cmd: Any, *a: Any, **kw: Any) -> subprocess.Popen:
            p = real(command, *a, **kw)
            self.procs.append(p)
            self.started.set()
            return p

        monkeypatch.setattr(bounded.subprocess, "Popen", popen)


def test_a_reader_that_never_answers_is_killed_at_the_time_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    spawned = _Spawned(monkeypatch, [sys.executable, "-c", "import time; time.sleep(600)"])
    with pytest.raises(DocumentError, match=r"took more than 0.5 s to read"):
        read_bytes("stuck.pdf", b"%PDF-1.4\n", None, Limits(seconds=0.5, page_seconds=60, memory=1 << 30))
    (p,) = spawned.procs
    assert p.poll() is not None  # killed, not left running


def test_a_reader_past_its_memory_is_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    hog = "import time; x = b'x' * (400 << 20); time.sleep(600)"  # touched: resident
    spawned = _Spawned(monkeypatch, [sys.executable, "-c", hog])
    with pytest.raises(DocumentError, match=r"needs more than 100 MiB of memory"):
        read_bytes("hog.docx", b"PK\x03\x04", None, Limits(seconds=600, page_seconds=600, memory=100 << 20))
    assert spawned.procs[0].poll() is not None


def test_a_reader_that_dies_is_a_refusal_naming_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    _Spawned(monkeypatch, [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"])
    with pytest.raises(DocumentError, match=r"^crash.pdf: cannot be read: the reader stopped without an answer "
                                            r"\(signal SIGSEGV\)"):
        read_bytes("crash.pdf", b"%PDF-1.4\n", None, QUICK)


# -- the server: other clients are answered while a hostile file is being read -----------------


@pytest.fixture(scope="module")
def server(llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.server_helpers import Server

    s = Server(llama, tmp_path_factory.mktemp("hostile-cache"), chunk=16)
    yield s
    s.close()


def _post(server: Any, body: dict) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(server.url + "/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


HOSTILE = {
    "text lines pdf": lambda: ("lines.pdf", H.pdf_of_text_lines(), "application/pdf"),
    "no-op pdf": lambda: ("noop.pdf", H.pdf_of_no_ops(), "application/pdf"),
    "zip bomb docx": lambda: ("bomb.docx", H.docx_inflating_to(300 << 20), "application/octet-stream"),
    "empty paragraphs docx": lambda: ("paras.docx", H.docx_of_empty_paragraphs(), "application/octet-stream"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_the_server_answers_others_while_a_hostile_file_is_read_and_then_refuses_it(
        server: Any, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mechanism: the hostile file's reading is held in flight (a gate on the reading
    thread) while another client lists the models and gets a 1-token reply; both complete while
    the hostile request is still pending; released, the file is read and refused with a 400
    naming its part. (Before issue 49 the file was read inside the handler, on the event loop.)"""
    name, data, mime = HOSTILE[case]()
    entered, release = threading.Event(), threading.Event()
    real = bounded.read_bytes

    def gated(*a: Any, **kw: Any) -> Any:
        entered.set()
        assert release.wait(TIMEOUT)
        return real(*a, **kw)

    monkeypatch.setattr(bounded, "read_bytes", gated)
    monkeypatch.setattr("engine.serve.files.LIMITS", QUICK)
    bad = {"model": server.model, "max_tokens": 1, "messages": [{"role": "user", "content": [
        file_part(name, data, mime), {"type": "text", "text": "Summarise."}]}]}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(_post, server, bad)
        try:
            assert entered.wait(TIMEOUT)
            models = server.client().models.list()
            reply = server.client().chat.completions.create(
                model=server.model, max_tokens=1, messages=[{"role": "user", "content": "Hi"}])
            assert models.data[0].id == server.model and reply.usage.completion_tokens == 1
            assert not pending.done()  # the others were answered while it was being read
        finally:
            release.set()
        status, body = pending.result(TIMEOUT)
    assert status == 400 and body["error"]["message"].startswith(f"{name}: "), body
    assert body["error"]["param"] == "messages[0].content[0].file"


def test_a_client_that_leaves_stops_the_reading_of_its_file(server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request whose client hangs up while its file is read: the reader process is killed."""
    import socket

    spawned = _Spawned(monkeypatch, [sys.executable, "-c", "import time; time.sleep(600)"])
    monkeypatch.setattr("engine.serve.files.LIMITS", Limits(seconds=600, page_seconds=600, memory=1 << 30))
    body = json.dumps({"model": server.model, "messages": [{"role": "user", "content": [
        file_part("slow.pdf", b"%PDF-1.4 slow", "application/pdf")]}]}).encode()
    hostport = server.url.split("//")[1].split("/")[0]
    host, port = hostport.split(":")
    with socket.create_connection((host, int(port)), timeout=TIMEOUT) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % (hostport.encode(), len(body)) + body)
        assert spawned.started.wait(TIMEOUT)  # its file is being read; now the client leaves
    assert spawned.procs[0].wait(TIMEOUT) is not None  # the handler was cancelled, the reader killed


# -- the smaller items -----------------------------------------------------------------------------


def test_binary_content_is_found_anywhere_in_the_file() -> None:
    """65,536 characters of text, then an ELF header, control bytes and terminal escapes (only the
    first 65,536 characters were checked)."""
    elf = b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 8 + b"\x02\x00\x3e\x00\x01\x00\x00\x00" + bytes(range(1, 32)) * 4
    data = b"-" * 65536 + elf + b"\x1b]0;PWNED\x07\x1b[2J"
    with pytest.raises(DocumentError, match="looks binary"):
        read_bytes("notes.txt", data)
    escapes_only = b"-" * 65536 + bytes(range(1, 9)) * 20  # no NUL: the block's share of controls
    with pytest.raises(DocumentError, match="looks binary"):
        read_bytes("notes.txt", escapes_only)
    assert read_bytes("log.txt", b"-" * 65536 + b"\x1b[1mbold\x1b[0m\n").kind == "text"  # a few escapes: text


def test_files_are_recognised_by_their_content_whatever_their_name_or_type() -> None:
    docx = docx_bytes(["Clause 1."], [["a", "b"]])
    pdf = pdf_bytes(["Page one."])
    assert read_bytes("upload", docx, "application/octet-stream").kind == "docx"
    assert read_bytes("upload.bin", pdf, "application/octet-stream").kind == "pdf"
    assert read_bytes("contract", docx).text.startswith("Clause 1.")
    with pytest.raises(DocumentError, match="a zip archive, not a Word document"):
        read_bytes("photos.zip", H.zipped({"a.txt": "x"}), "application/octet-stream")
    with pytest.raises(DocumentError, match="Office 97-2003"):
        read_bytes("old.doc", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\x00" * 512)


def test_a_pdf_encrypted_with_an_empty_user_password_is_read_and_the_docs_say_so() -> None:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("helvetica", size=11)
    pdf.add_page()
    pdf.multi_cell(0, 6, "Opens without a password.")
    pdf.set_encryption(owner_password="owner", user_password="")
    doc = read_bytes("open.pdf", bytes(pdf.output()))
    assert doc.text == "Opens without a password."
    with pytest.raises(DocumentError, match="encrypted with a password"):
        read_bytes("locked.pdf", pdf_bytes(["x"], password="pw"))
    docs = (Path(__file__).resolve().parents[2] / "docs" / "documents.md").read_text()
    assert "empty user password" in docs and "is read" in docs


NAME = "r\x1b]0;PWNED\x07\x1b[2J\r\u202eFDP.exe"


def test_a_file_name_is_shown_and_rendered_with_controls_and_bidi_overrides_escaped() -> None:
    shown = shown_name(NAME)
    assert shown == "r\\x1b]0;PWNED\\x07\\x1b[2J\\r\\u202eFDP.exe" and shown_name(shown) == shown
    with pytest.raises(DocumentError) as e:
        document_from_bytes(NAME, b"\x00binary")
    assert str(e.value).startswith(shown + ": ")
    doc = document_from_bytes(NAME, b"Some text.")
    system = place([{"role": "user", "content": "Q?"}], [doc])[0]["content"]
    assert system.startswith(f'<document name="{shown}">') and not any(c in system for c in "\x1b\x07\r\u202e")


def test_the_cli_prints_a_file_name_escaped(llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A refusal and a reply's summary name the file with its escape sequences escaped (they
    retitled and cleared the terminal)."""
    bad = tmp_path / "r\x1b]0;PWNED\x07\x1b[2J.pdf"
    bad.write_bytes(b"%PDF-1.4 broken")
    (tmp_path / "q.json").write_text(json.dumps([{"role": "user", "content": "Hi"}]))
    assert cli(["generate", "--model", str(tmp_path / "none"), "--messages", str(tmp_path / "q.json"),
                "--attach", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "r\\x1b]0;PWNED\\x07\\x1b[2J.pdf: not a readable PDF" in err and "\x1b" not in err and "\x07" not in err
    good = tmp_path / "n\x1b[2J\u202eotes.md"
    good.write_text("Some notes about the sky.")
    assert cli(["generate", "--model", str(llama), "--messages", str(tmp_path / "q.json"), "--max-tokens", "2",
                "--no-cache", "--attach", str(good)]) == 0
    out = capsys.readouterr()
    assert "n\\x1b[2J\\u202eotes.md: " in out.out + out.err
    assert not any(c in out.out + out.err for c in "\x1b\u202e")


def test_a_file_part_in_an_assistant_message_says_where_files_go(server: Any) -> None:
    status, body = _post(server, {"model": server.model, "messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [file_part("a.txt", b"text", "text/plain")]},
        {"role": "user", "content": "Go on"}]})
    assert status == 400 and body["error"]["param"] == "messages[1].content[0]"
    assert "file parts go in user and system messages" in body["error"]["message"], body


def test_what_a_file_holds_and_is_not_read_is_in_the_server_s_report(server: Any) -> None:
    data = H.word(H.p("The area is given by ", "<m:oMath><m:r><m:t>x</m:t></m:r></m:oMath>", "."))
    status, body = _post(server, {"model": server.model, "max_tokens": 1, "messages": [
        {"role": "user", "content": [file_part("area.docx", data, "application/octet-stream"),
                                     {"type": "text", "text": "What is the area?"}]}]})
    assert status == 200, body
    (span,) = body["verbatim"]["documents"]
    assert span["name"] == "area.docx" and span["unread"] == ["1 equation"]


def test_more_documents_than_the_disk_keeps_are_refused_where_the_request_comes_in(server: Any, llama: Path) -> None:
    parts = [file_part(f"n{i}.txt", f"Note {i}.".encode(), "text/plain") for i in range(MAX_DOCUMENTS + 1)]
    status, body = _post(server, {"model": server.model, "max_tokens": 1, "messages": [
        {"role": "user", "content": "Hi"}, {"role": "user", "content": parts}]})
    assert status == 400 and body["error"]["param"] == "messages[1].content", body
    assert f"more than {MAX_DOCUMENTS} documents" in body["error"]["message"]
    # The same limit in the engine (the window, the CLI), before any prefill.
    docs = tuple(document_from_bytes(f"n{i}.txt", f"Note {i}.".encode()) for i in range(MAX_DOCUMENTS + 1))
    req = GenerationRequest([{"role": "user", "content": "Hi"}], SamplerSettings(max_tokens=1), documents=docs)
    with pytest.raises(RequestError, match=f"at most {MAX_DOCUMENTS}"):
        server.engine(lambda e: e.generate(req))


def test_a_document_holding_control_token_text_is_reported_with_its_true_span(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """The prompt encodes a marker's text typed in a document as text (issue 36); the document's
    span is counted the same way, so its end is a cut and its tokens are the block's (it was
    counted with the markers as control tokens: fewer tokens, and no cut)."""
    from engine.documents.placement import block
    from engine.engine import Engine
    from engine.generate.templating import _markers
    from tests.engine_helpers import FORGED
    from tests.tiny_models import build_tool_model

    eng = Engine(use_disk=False, chunk=16)
    eng.load(str(build_tool_model(tmp_path_factory.mktemp("models") / "qwen-tools")))
    try:
        doc = document_from_bytes("forged.md", (FORGED + "\nThe end.").encode())
        r = eng.generate(GenerationRequest([{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": "Summarise."}],
                                           SamplerSettings(max_tokens=1), documents=(doc,)))
        (span,) = r.report.documents
        tok = eng.lm.tokenizer
        inside = r.prompt_ids[span["start"]:span["end"]]
        markers = _markers(tok)
        assert markers is not None and not set(inside) & set(markers.ids.values())  # all text, no control token
        assert tok._tokenizer.decode(inside, skip_special_tokens=False).strip() == block(doc)
        assert span["cut"] and span["tokens"] == len(inside)
    finally:
        eng.close()


def _serve(model: Path, cache: Path, *keys: str) -> tuple[subprocess.Popen, int]:
    """`python -m engine serve` with these API keys, on an ephemeral port; (process, port)."""
    import os

    args = [a for k in keys for a in ("--api-key", k)]
    p = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--model", str(model), "--port", "0",
                          "--cache-dir", str(cache), "--chunk", "16", *args],
                         stderr=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2],
                         env={**os.environ})
    assert p.stderr is not None
    p.preloaded = 0  # type: ignore[attr-defined]
    for line in p.stderr:
        if line.startswith("read ") and "kept states" in line:
            p.preloaded = int(line.split()[1])  # type: ignore[attr-defined]
        if line.startswith("Verbatim server:") and " at http" in line:
            return p, int(line.split(" at ", 1)[1].split()[0].split(":")[2].split("/")[0])
    raise AssertionError(f"the server did not start (rc {p.wait(TIMEOUT)})")


def test_engine_serve_reads_every_api_namespace_s_documents_ahead(llama: Path, tmp_path: Path) -> None:
    """After a restart, `engine serve` reads every API namespace's kept document states into
    memory (it read only the window's namespace, which a server never uses). The proof: once the
    restarted server is up, the disk's snapshot files are deleted; each key's new question about
    its document still restores the document, from what was read ahead."""
    import openai

    files = {"key-one": ("report.md", REPORT), "key-two": ("appendix.md", APPENDIX)}

    def ask(port: int, key: str, question: str) -> dict:
        name, text = files[key]
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=TIMEOUT)
        return client.chat.completions.create(model=llama.name, max_tokens=2, seed=1, messages=[
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": [file_part(name, text.encode(), "text/markdown"),
                                         {"type": "text", "text": question}]}]).verbatim

    for restart in (False, True):
        p, port = _serve(llama, tmp_path / "cache", *files)
        try:
            if restart:
                assert p.preloaded == len(files)  # type: ignore[attr-defined]  # one document state per key
                for pack in (tmp_path / "cache").rglob("*.safetensors"):
                    pack.unlink()  # from now on only memory holds them
            for key in files:
                v = ask(port, key, "What is the capital of France?" if restart else "Why is the sky blue?")
                (span,) = v["documents"]
                if restart:
                    assert v["restored"] >= span["end"] and span["source"] != "prefilled", (key, v)
                    assert not v["declines"], v["declines"]
                else:
                    assert span["source"] == "prefilled"
        finally:
            p.terminate()
            assert p.wait(TIMEOUT) == 0
