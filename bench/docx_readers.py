""".docx text: engine/documents/word.py against python-docx (what it replaced), docx2python and
mammoth, on the corpus of Word constructs the tests build (tests/hostile_files.py) and on two
larger files, each reader in a process of its own (seconds and peak memory).

    .venv/bin/pip install --target /tmp/docxlibs docx2python==3.7.1 mammoth==1.13.0  # not dependencies
    rm -rf /tmp/docxlibs/lxml* /tmp/docxlibs/typing_extensions*  # the environment's own are used
    PYTHONPATH=.:/tmp/docxlibs .venv/bin/python bench/docx_readers.py

A construct is read right when each text Word shows for it appears (its words in order; note
marks, markup, table separators and spacing as each reader writes them) and no text Word
does not show (deleted text, a field's code, a content control's properties) does.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import hostile_files as H  # noqa: E402

READERS = ("word.py", "python-docx", "docx2python", "mammoth")


def ours(data: bytes) -> str:
    from engine.documents.word import read_docx

    return read_docx("x.docx", data, 10**9, lambda: None).text


def python_docx(data: bytes) -> str:
    import docx

    d = docx.Document(io.BytesIO(data))
    parts = [p.text for p in d.paragraphs]
    for table in d.tables:
        for row in table.rows:
            parts.append(" | ".join(cell.text for cell in row.cells))
    return "\n".join(parts)


def docx2python_text(data: bytes) -> str:
    from docx2python import docx2python

    with docx2python(io.BytesIO(data)) as d:
        return str(d.text)


def mammoth_text(data: bytes) -> str:
    import mammoth

    return str(mammoth.extract_raw_text(io.BytesIO(data)).value)


FUNCS: dict[str, Callable[[bytes], str]] = {"word.py": ours, "python-docx": python_docx,
                                            "docx2python": docx2python_text, "mammoth": mammoth_text}


# Note marks and markup as each reader writes them: [1] and [i] (word.py), ----footnote2---- and
# footnote2) (docx2python), and HTML tags (docx2python's hyperlinks).
_MARKS = re.compile(r"\[(\d+|[ivx]+)\]|----\w+----|\b(foot|end)note\d+\)")
_TAGS = re.compile(r"<[^>]+>")


def words(text: str) -> list[str]:
    return re.findall(r"[^\s|]+", _MARKS.sub(" ", _TAGS.sub("", text)))


def contains(text: str, wanted: str) -> bool:
    have, want = words(text), words(wanted)
    return any(have[i:i + len(want)] == want for i in range(len(have) - len(want) + 1))


def right(text: str, c: H.Construct) -> bool:
    return all(contains(text, s) for s in c.shown) and not any(contains(text, s) for s in c.not_shown)


def child(reader: str, path: str) -> None:
    """In a process of its own: read the file, print seconds, peak RSS (MiB) and characters."""
    import resource

    data = Path(path).read_bytes()
    t = time.perf_counter()
    try:
        n = len(FUNCS[reader](data))
    except Exception as e:  # noqa: BLE001  (a reader's refusal is a result here)
        n = -1
        print(f"{type(e).__name__}: {str(e)[:80]}", file=sys.stderr)
    print(json.dumps({"s": time.perf_counter() - t, "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
                      "chars": n}))


def measured(reader: str, path: Path, timeout: float = 300) -> str:
    try:
        out = subprocess.run([sys.executable, __file__, "--child", reader, str(path)], capture_output=True,
                             text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"> {timeout:.0f} s"
    if out.returncode != 0 or not out.stdout.strip():
        return f"failed (rc {out.returncode})"
    r = json.loads(out.stdout.strip().splitlines()[-1])
    if r["chars"] < 0:
        return f"refused, {r['s']:.2f} s"
    return f"{r['s']:.2f} s, {r['rss_mib']} MiB"


def large_document(paragraphs: int = 20_000) -> bytes:
    """A long contract: numbered clauses of several runs, a table every 50 clauses."""
    body = []
    for i in range(paragraphs):
        body.append(H.p(f"Clause {i}. ", H.run("The buyer pays ", "<w:b/>"), "within thirty days of delivery."))
        if i % 50 == 49:
            body.append(H.table(["Party", "Role"], [f"Buyer {i}", "Pays"]))
    return H.word("".join(body))


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3])
        return 0
    corpus = H.corpus()
    print("| construct | " + " | ".join(READERS) + " |")
    print("|---" * (len(READERS) + 1) + "|")
    totals = dict.fromkeys(READERS, 0)
    for c in corpus:
        cells = []
        for reader in READERS:
            try:
                ok = right(FUNCS[reader](c.data), c)
            except Exception:  # noqa: BLE001
                ok = False
            totals[reader] += ok
            cells.append("yes" if ok else "**no**")
        print(f"| {c.name} | " + " | ".join(cells) + " |")
    print(f"| **right** | " + " | ".join(f"{totals[r]}/{len(corpus)}" for r in READERS) + " |")
    print()
    tmp = Path("/tmp/docx-readers-bench")
    tmp.mkdir(exist_ok=True)
    files = {"20,000 clauses (1.4 M characters)": large_document(),
             "900,000 empty paragraphs": H.docx_of_empty_paragraphs()}
    print("| file | size | " + " | ".join(READERS) + " |")
    print("|---" * (len(READERS) + 2) + "|")
    for label, data in files.items():
        path = tmp / "f.docx"
        path.write_bytes(data)
        print(f"| {label} | {len(data) / 1024:,.0f} KiB | " + " | ".join(measured(r, path) for r in READERS) + " |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
