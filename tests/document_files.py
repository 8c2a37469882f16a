"""Real document files for tests that attach them: PDFs (fpdf2, plain or encrypted) and
.docx files (python-docx), as bytes; two texts to attach, and a file as a chat message's part."""

from __future__ import annotations

import base64
import io

# A document long enough to span several prefill chunks, in words the tiny tokenizer knows.
REPORT = "\n".join(f"Section {i}. The quick brown fox jumps over the lazy dog. Why is the sky blue? "
                   f"Because of Rayleigh scattering of sunlight in the atmosphere." for i in range(12))
APPENDIX = "The capital of France is Paris. The capital of Italy is Rome.\n" * 6


def pdf_bytes(pages: list[str], password: str | None = None) -> bytes:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("helvetica", size=11)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, 6, text)
    if password:
        pdf.set_encryption(owner_password=password, user_password=password)
    return bytes(pdf.output())


def docx_bytes(paragraphs: list[str], table: list[list[str]]) -> bytes:
    import docx

    d = docx.Document()
    for p in paragraphs:
        d.add_paragraph(p)
    t = d.add_table(rows=len(table), cols=len(table[0]))
    for r, row in enumerate(table):
        for c, cell in enumerate(row):
            t.cell(r, c).text = cell
    out = io.BytesIO()
    d.save(out)
    return out.getvalue()


def file_part(name: str, data: bytes, mime: str) -> dict:
    """A `file` content part (OpenAI's shape): the file as a base64 data URL."""
    return {"type": "file", "file": {"filename": name, "file_data": f"data:{mime};base64,"
                                     + base64.b64encode(data).decode()}}
