"""Real document files for tests that attach them: PDFs (fpdf2, plain or encrypted) and
.docx files (python-docx), as bytes."""

from __future__ import annotations

import io


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
