"""A PDF's text through PDFium (pypdfium2), page by page against the character budget.

Each page's text layer, pages joined by a blank line. A page's characters are counted before its
text is taken, so a page that holds more than the budget left is refused without its text ever
being made. PDFium itself cannot be interrupted while it parses a page (a page of 100 million
operators takes seconds, a page of 18 million characters gigabytes): bounded.py runs this in a
process of its own and kills it at its time and memory limits; `tick` marks each page's start.

A PDF encrypted with an empty user password is read (every viewer opens it without asking);
one that needs a password is refused. Form fields and comments (annotations) are not in a
page's text layer: they are counted and named as not read.
"""

from __future__ import annotations

from engine.documents.document import DocumentError, Extracted, Tick, named, too_much_text

_NOT_READ = {1: "comment", 3: "comment", 20: "form field"}  # FPDF_ANNOT_TEXT, _FREETEXT, _WIDGET


def read_pdf(name: str, data: bytes, chars: int, tick: Tick) -> Extracted:
    import pypdfium2

    try:
        pdf = pypdfium2.PdfDocument(data)
    except pypdfium2.PdfiumError as e:
        why = str(e)
        if "password" in why.lower():
            raise DocumentError(name, "the PDF is encrypted with a password; open it and save an unlocked copy") from None
        raise DocumentError(name, f"not a readable PDF ({why})") from None
    pages: list[str] = []
    used = 0
    unread: dict[str, int] = {}
    try:
        for i in range(len(pdf)):
            tick()
            page = pdf[i]
            try:
                _count_annotations(page, unread)
                textpage = page.get_textpage()
                try:
                    n = textpage.count_chars()
                    if used + n > chars:
                        raise too_much_text(name, used + n, chars, more=True)
                    text = textpage.get_text_range()
                finally:
                    textpage.close()
            finally:
                page.close()
            used += len(text) + 2
            pages.append(text)
    except pypdfium2.PdfiumError as e:
        raise DocumentError(name, f"a page of the PDF cannot be read ({e})") from None
    finally:
        pdf.close()
    return Extracted("\n\n".join(pages), len(pages), named(unread))


def _count_annotations(page: object, into: dict[str, int]) -> None:
    import pypdfium2.raw as pdfium_c

    raw = page.raw  # type: ignore[attr-defined]
    for k in range(pdfium_c.FPDFPage_GetAnnotCount(raw)):
        annot = pdfium_c.FPDFPage_GetAnnot(raw, k)
        if annot:
            what = _NOT_READ.get(pdfium_c.FPDFAnnot_GetSubtype(annot))
            pdfium_c.FPDFPage_CloseAnnot(annot)
            if what:
                into[what] = into.get(what, 0) + 1

