"""Regenerate docs/screenshot-documents.png: a chat about a PDF after a restart, the debug
panel showing the document's state restored from disk (issue 38), at 1200x800.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        .venv/bin/python docs/make_documents_screenshot.py [--model demo]

Offscreen, in a throw-away data dir, with a fixed seed. It writes a two-page PDF (fpdf2, a
test dependency), asks about it, closes the window (the prompt cache is on disk), opens a new
one on the same data, starts a new conversation, attaches the same PDF, asks another question
and grabs the window with the debug panel open. It fails unless the document came from disk.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PAGES = [
    "Verbatim field report, spring release.\n\nRegenerate now repeats a reply bit for bit, from memory and from "
    "disk after a restart. Users asked for documents: a PDF is read once, and its state is kept by the prompt "
    "cache, so every later question starts at once.",
    "Numbers.\n\nA 6,000-token document: the first question reads it (cold). A second question in a new "
    "conversation restored the document from memory 124 times sooner, and from disk after a restart 56 times "
    "sooner. Every reply equals its cold run.",
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="demo")
    p.add_argument("--out", type=Path, default=ROOT / "docs")
    args = p.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

    from fpdf import FPDF
    from shots import ready_window, settle, wait_until  # docs/shots.py, beside this script

    from engine.types import SamplerSettings

    work = Path(tempfile.mkdtemp(prefix="verbatim-documents-"))
    pdf = FPDF()
    pdf.set_font("helvetica", size=11)
    for text in PAGES:
        pdf.add_page()
        pdf.multi_cell(0, 6, text)
    report = work / "field-report.pdf"
    report.write_bytes(bytes(pdf.output()))
    sampler = SamplerSettings(temperature=0.0, max_tokens=60, seed=5)

    def ask(w: object, question: str) -> None:
        w.attach.attach([str(report)])  # type: ignore[attr-defined]
        wait_until(lambda: bool(w.chat.composer.attachments.items) and w.chat.composer.attachments.items[0].tokens is not None)  # type: ignore[attr-defined]
        w.composer.setPlainText(question)  # type: ignore[attr-defined]
        w.reply_bar.send()  # type: ignore[attr-defined]
        wait_until(lambda: not w.chat.generation.busy)  # type: ignore[attr-defined]

    try:
        w, _ = ready_window(args.model, sampler, data_dir=work / "data")
        ask(w, "What does the report say about regenerate?")
        w.close()  # the prompt cache's disk tier is flushed
        w, _ = ready_window(args.model, sampler, data_dir=work / "data")
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    w.conversations.new()
    w.resize(1200, 800)
    w.debug_panel.show()
    ask(w, "How much sooner did a second question start?")
    reply = [vm for vm in w.chat.conversation.vms if vm.role == "assistant"][-1]
    w.chat.conversation.select(reply.id)
    settle()
    source = reply.report.documents[0]["source"] if reply.report and reply.report.documents else None
    if source != "disk":
        print(f"the document did not come from disk ({source!r})", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    w.grab().save(str(args.out / "screenshot-documents.png"))
    print(w.debug_panel.documents.text())
    w.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
