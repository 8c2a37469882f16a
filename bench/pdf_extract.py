"""PDF text extraction: pypdfium2 (what engine/documents uses) against pypdf, on real PDFs.

    .venv/bin/pip install pypdf   # not a dependency: only this comparison needs it
    PYTHONPATH=. .venv/bin/python bench/pdf_extract.py /usr/share/doc/*/*.pdf

For each file: seconds to extract every page's text (best of 3), characters, and how alike the
two texts are (difflib's ratio over words), so speed is weighed with text quality.
"""

from __future__ import annotations

import difflib
import sys
import time
from pathlib import Path


def pdfium_text(data: bytes) -> str:
    import pypdfium2

    pdf = pypdfium2.PdfDocument(data)
    try:
        return "\n\n".join(pdf[i].get_textpage().get_text_range() for i in range(len(pdf)))
    finally:
        pdf.close()


def pypdf_text(data: bytes) -> str:
    import io

    import pypdf

    return "\n\n".join(page.extract_text() or "" for page in pypdf.PdfReader(io.BytesIO(data)).pages)


def best(fn, data: bytes, n: int = 3) -> tuple[float, str]:
    times, text = [], ""
    for _ in range(n):
        t = time.perf_counter()
        text = fn(data)
        times.append(time.perf_counter() - t)
    return min(times), text


def main(paths: list[str]) -> None:
    print("| file | pages | pypdfium2 s | pypdf s | pypdf / pypdfium2 | chars (pdfium / pypdf) | words alike |")
    print("|---|---|---|---|---|---|---|")
    import pypdfium2

    for p in paths:
        data = Path(p).read_bytes()
        pages = len(pypdfium2.PdfDocument(data))
        t1, a = best(pdfium_text, data)
        t2, b = best(pypdf_text, data)
        alike = difflib.SequenceMatcher(None, a.split(), b.split(), autojunk=False).ratio()
        print(f"| {Path(p).name} | {pages} | {t1:.3f} | {t2:.3f} | {t2 / t1:.1f}x | {len(a):,} / {len(b):,} | "
              f"{alike:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
