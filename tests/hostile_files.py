"""Files built by hand for the documents' tests and bench/hostile_files.py (issue 49): hostile
PDFs and .docx files that are small on disk and huge once read, and a corpus of Word documents,
one construct each, with the text Word shows for it.

Nothing here is stored in the repository as a file: each test builds what it sends.
"""

from __future__ import annotations

import io
import zipfile
import zlib
from dataclasses import dataclass, field

# -- PDF ---------------------------------------------------------------------------------------


def raw_pdf(content: bytes, pages: int = 1) -> bytes:
    """A PDF of `pages` pages that all draw one content stream (FlateDecode: `content` may be
    hundreds of megabytes and the file a few hundred kilobytes)."""
    stream = zlib.compress(content, 9)
    kids = " ".join(f"{3 + i} 0 R" for i in range(pages)).encode()
    contents, font = 3 + pages, 4 + pages
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, pages)]
    objs += [b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R "
             b"/Resources << /Font << /F1 %d 0 R >> >> >>" % (contents, font)] * pages
    objs += [b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream",
             b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, obj in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + obj + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return bytes(out)


def pdf_of_text_lines(lines: int = 200_000, width: int = 90) -> bytes:
    """One page of `lines` `(AAAA...) Tj` operators: ~70 KB, 18 million characters of text, and
    PDFium takes gigabytes to lay out its text page (issue 49: 48-57 s, 5.8 GB)."""
    return raw_pdf(b"BT /F1 1 Tf\n" + (b"(" + b"A" * width + b") Tj\n") * lines + b"ET\n")


def pdf_of_no_ops(operators: int = 100_000_000) -> bytes:
    """One page of `operators` no-op operators (`q Q`) and a word of text: a few hundred KB that
    PDFium parses for many seconds before any text comes out."""
    return raw_pdf(b"q Q " * (operators // 2) + b"BT /F1 12 Tf 72 700 Td (Hello) Tj ET\n")


# -- Word --------------------------------------------------------------------------------------

NS = ('xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main" '
      'xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships" '
      'xmlns:mc="http://schemas.openxmlformats.org/markup-compatibility/2006" '
      'xmlns:m="http://schemas.openxmlformats.org/officeDocument/2006/math" '
      'xmlns:wp="http://schemas.openxmlformats.org/drawingml/2006/wordprocessingDrawing" '
      'xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main" '
      'xmlns:pic="http://schemas.openxmlformats.org/drawingml/2006/picture" '
      'xmlns:wps="http://schemas.microsoft.com/office/word/2010/wordprocessingShape" '
      'xmlns:v="urn:schemas-microsoft-com:vml" mc:Ignorable="wps"')
REL = "http://schemas.openxmlformats.org/officeDocument/2006/relationships/"
CONTENT_TYPES = ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
                 '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
                 '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
                 '<Default Extension="xml" ContentType="application/xml"/>'
                 '<Override PartName="/word/document.xml" ContentType="application/vnd.openxmlformats-officedocument.'
                 'wordprocessingml.document.main+xml"/></Types>')
PACKAGE_RELS = ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
                '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
                f'<Relationship Id="rId1" Type="{REL}officeDocument" Target="word/document.xml"/></Relationships>')


def p(*runs: str) -> str:
    """A paragraph of runs (each a run's XML, or plain text made a run)."""
    return "<w:p>" + "".join(r if r.startswith("<") else run(r) for r in runs) + "</w:p>"


def run(text: str, props: str = "") -> str:
    return f'<w:r>{f"<w:rPr>{props}</w:rPr>" if props else ""}<w:t xml:space="preserve">{text}</w:t></w:r>'


def table(*rows: list[str]) -> str:
    """A table; each cell is block XML (paragraphs, a nested table) or plain text."""
    def cell(c: str) -> str:
        return f"<w:tc>{c if c.startswith('<') else p(c)}</w:tc>"

    return "<w:tbl>" + "".join("<w:tr>" + "".join(cell(c) for c in row) + "</w:tr>" for row in rows) + "</w:tbl>"


def part(root: str, inner: str) -> str:
    return f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:{root} {NS}>{inner}</w:{root}>'


def word(body: str, parts: dict[str, str] | None = None, rels: dict[str, tuple[str, str]] | None = None,
         sect: str = "") -> bytes:
    """A .docx: `body` (the body's block XML), extra parts (path -> XML) and the main part's
    relationships (id -> (type's last word, target relative to word/)), `sect` inside the
    body's last w:sectPr."""
    document = part("document", f"<w:body>{body}<w:sectPr>{sect}</w:sectPr></w:body>")
    rel_xml = "".join(f'<Relationship Id="{i}" Type="{REL}{kind}" Target="{target}"'
                      + (' TargetMode="External"/>' if "://" in target else "/>")
                      for i, (kind, target) in (rels or {}).items())
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("[Content_Types].xml", CONTENT_TYPES)
        z.writestr("_rels/.rels", PACKAGE_RELS)
        z.writestr("word/document.xml", document)
        z.writestr("word/_rels/document.xml.rels",
                   '<?xml version="1.0" encoding="UTF-8" standalone="yes"?><Relationships '
                   f'xmlns="http://schemas.openxmlformats.org/package/2006/relationships">{rel_xml}</Relationships>')
        for path, xml in (parts or {}).items():
            z.writestr(path, xml)
    return out.getvalue()


def zipped(files: dict[str, str]) -> bytes:
    """A zip archive of text files (not a Word document)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for path, text in files.items():
            z.writestr(path, text)
    return out.getvalue()


def notes(kind: str, texts: dict[str, str]) -> str:
    """footnotes.xml / endnotes.xml: Word's two separator notes, then one note per id."""
    tag = kind[:-1]  # footnote / endnote
    seps = "".join(f'<w:{tag} w:type="{t}" w:id="{i}">{p("<w:r><w:separator/></w:r>")}</w:{tag}>'
                   for i, t in (("-1", "separator"), ("0", "continuationSeparator")))
    return part(kind, seps + "".join(
        f'<w:{tag} w:id="{i}">{p(f"<w:r><w:{tag}Ref/></w:r>", " " + t)}</w:{tag}>' for i, t in texts.items()))


def text_box(text: str) -> str:
    """A text box as Word writes it: a DrawingML box, and the same box in VML as the fallback."""
    box = f"<w:txbxContent>{p(text)}</w:txbxContent>"
    return ("<w:r><mc:AlternateContent><mc:Choice Requires=\"wps\"><w:drawing><wp:anchor><a:graphic>"
            "<a:graphicData uri=\"http://schemas.microsoft.com/office/word/2010/wordprocessingShape\">"
            f"<wps:wsp><wps:txbx>{box}</wps:txbx></wps:wsp></a:graphicData></a:graphic></wp:anchor></w:drawing>"
            f"</mc:Choice><mc:Fallback><w:pict><v:shape><v:textbox>{box}</v:textbox></v:shape></w:pict>"
            "</mc:Fallback></mc:AlternateContent></w:r>")


@dataclass
class Construct:
    """One Word construct: the .docx, the text Word shows (each must be read) and the text it
    does not show (none may be)."""

    name: str
    data: bytes
    shown: tuple[str, ...]
    not_shown: tuple[str, ...] = ()
    unread: tuple[str, ...] = ()  # what the reader names as not read
    extra: dict = field(default_factory=dict)


def corpus() -> list[Construct]:
    """Each construct that carries text in a Word document, in a document of its own."""
    fld = ('<w:r><w:fldChar w:fldCharType="begin"/></w:r><w:r><w:instrText> PAGE </w:instrText></w:r>'
           '<w:r><w:fldChar w:fldCharType="separate"/></w:r>' + run("7") + '<w:r><w:fldChar w:fldCharType="end"/></w:r>')
    note_rels = {"rIdF": ("footnotes", "footnotes.xml"), "rIdE": ("endnotes", "endnotes.xml")}
    margins = {"rIdH": ("header", "header1.xml"), "rIdG": ("footer", "footer1.xml")}
    sect = '<w:headerReference w:type="default" r:id="rIdH"/><w:footerReference w:type="default" r:id="rIdG"/>'
    ins = '<w:ins w:id="1" w:author="A">' + run("NOT ") + "</w:ins>"
    deleted = '<w:del w:id="2" w:author="A"><w:r><w:delText>ninety </w:delText></w:r></w:del>'
    moved_from = '<w:moveFrom w:id="3" w:author="A">' + run("Old place. ") + "</w:moveFrom>"
    moved_to = '<w:moveTo w:id="4" w:author="A">' + run("Old place.") + "</w:moveTo>"
    block_sdt = '<w:sdt><w:sdtPr><w:alias w:val="Client name"/></w:sdtPr><w:sdtContent>' + p("Client: ACME Corp")
    block_sdt += "</w:sdtContent></w:sdt>"
    run_sdt = '<w:sdt><w:sdtPr><w:alias w:val="Signer"/></w:sdtPr><w:sdtContent>' + run("Jane Roe")
    run_sdt += "</w:sdtContent></w:sdt>"
    smart = '<w:smartTag w:uri="urn:x" w:element="place">' + run("Paris") + "</w:smartTag>"
    simple = '<w:fldSimple w:instr=" DOCPROPERTY Total ">' + run("$1,200") + "</w:fldSimple>"
    link = '<w:hyperlink r:id="rIdL">' + run("the terms") + "</w:hyperlink>"
    both_notes = {"word/footnotes.xml": notes("footnotes", {"2": "Source: the 2024 report."}),
                  "word/endnotes.xml": notes("endnotes", {"5": "An endnote."})}
    return [
        Construct("tracked insertion", word(p("The fee is ", ins, "refundable.")), ("The fee is NOT refundable.",)),
        Construct("tracked deletion", word(p("Pay in ", deleted, "thirty days.")), ("Pay in thirty days.",),
                  ("ninety",)),
        Construct("moved text", word(p(moved_from, "Stays. ", moved_to)), ("Stays. Old place.",)),
        Construct("content control", word(block_sdt + p("Signed by ", run_sdt)),
                  ("Client: ACME Corp", "Signed by Jane Roe"), ("Client name", "Signer")),
        Construct("smart tag", word(p("Meet in ", smart, ".")), ("Meet in Paris.",)),
        Construct("simple field", word(p("Total: ", simple)), ("Total: $1,200",), ("DOCPROPERTY",)),
        Construct("complex field", word(p("Page ", fld)), ("Page 7",), ("PAGE",)),
        Construct("nested table", word(table(["Outer A", table(["Inner 1", "Inner 2"])])),
                  ("Outer A", "Inner 1 | Inner 2")),
        Construct("customXml block", word('<w:customXml w:element="clause">' + p("Custom clause text.")
                                          + "</w:customXml>"), ("Custom clause text.",)),
        Construct("hyperlink", word(p("See ", link, "."), rels={"rIdL": ("hyperlink", "https://example.com")}),
                  ("See the terms.",)),
        Construct("text box", word(p(text_box("Boxed note."), run("Anchor paragraph."))),
                  ("Anchor paragraph.\nBoxed note.",), ("Boxed note.\nBoxed note.",)),
        Construct("footnote", word(p("Claim", '<w:r><w:footnoteReference w:id="2"/></w:r>', "."), both_notes,
                                   note_rels), ("Claim[1].", "[1] Source: the 2024 report.")),
        Construct("endnote", word(p("Claim", '<w:r><w:endnoteReference w:id="5"/></w:r>', "."), both_notes,
                                  note_rels), ("Claim[i].", "[i] An endnote.")),
        Construct("header and footer", word(p("Body text."), {"word/header1.xml": part("hdr", p("ACME Confidential")),
                                                              "word/footer1.xml": part("ftr", p("Page footer"))},
                                            margins, sect), ("ACME Confidential", "Body text.", "Page footer")),
        Construct("tab and break", word(p("Name:", "<w:r><w:tab/></w:r>", "Ann", "<w:r><w:br/></w:r>", "Line two")),
                  ("Name:\tAnn\nLine two",)),
        Construct("hidden text", word(p("Shown. ", run("Hidden words.", "<w:vanish/>"))), ("Shown.",),
                  ("Hidden words.",), ("1 hidden text run",)),
        Construct("equation", word(p("Area: ", "<m:oMath><m:r><m:t>x2</m:t></m:r></m:oMath>")), ("Area:",), (),
                  ("1 equation",)),
        Construct("comment", word(p("Draft clause.", '<w:r><w:commentReference w:id="0"/></w:r>')),
                  ("Draft clause.",), (), ("1 comment",)),
    ]


def docx_inflating_to(size: int) -> bytes:
    """A .docx whose document.xml inflates to about `size` bytes (one paragraph repeated): about
    a thousandth of that on disk."""
    head = part("document", "<w:body>")[:-len("</w:document>")].encode()
    block = p("A" * 100).encode() * 8192
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        z.writestr("[Content_Types].xml", CONTENT_TYPES)
        z.writestr("_rels/.rels", PACKAGE_RELS)
        with z.open("word/document.xml", "w", force_zip64=True) as f:
            f.write(head)
            for _ in range(max(size // len(block), 1)):
                f.write(block)
            f.write(b"</w:body></w:document>")
    return out.getvalue()


def docx_of_empty_paragraphs(n: int = 900_000) -> bytes:
    """A .docx of `n` empty paragraphs: ~120 KB on disk (issue 49: 83 s and 1 GB through python-docx)."""
    return word("<w:p/>" * n)
