"""A Word document's (.docx) text as Word shows it with tracked changes accepted, in document order.

The zip's declared sizes are checked before any XML is parsed (a part that inflates past
MAX_XML_BYTES is refused; zipfile never inflates past a declared size, and a part that lies
about it fails its CRC). The XML is read incrementally with expat, a chunk at a time, with no
tree kept, and the text is counted against the character budget as it comes: a document of a
million empty paragraphs or a gigabyte of XML costs the reader a bounded amount of memory and is
stopped at the budget. A DOCTYPE (the way to XXE and entity expansion) is refused.

What is read, where it goes:
- the body in document order: paragraphs one a line, a table row as `cell | cell` (a cell's
  paragraphs on their lines, a nested table's rows inside its cell);
- tracked insertions (`w:ins`, `w:moveTo`) in, deletions (`w:del`, `w:moveFrom`, deleted table
  rows) out; content controls (`w:sdt`, their content, not their properties), smart tags,
  `customXml`, hyperlinks; fields as their shown result (`fldSimple`'s runs, a complex field's
  runs after its separator), never their codes;
- tabs, line breaks, non-breaking hyphens and symbols as characters;
- text boxes (DrawingML and VML): their paragraphs after the paragraph that anchors them (of
  `mc:AlternateContent` only the first choice, so a box is not read twice);
- footnotes and endnotes: `[1]` (endnotes `[i]`) where they are referenced, their text after
  the body, `[1] text` one a line, in reference order;
- headers, each distinct one once, before the body; footers, each distinct one once, at the end.

Named as not read (`Document.unread`): equations, comments, pictures, charts, SmartArt,
embedded objects and documents (`altChunk`), hidden text, symbols from symbol fonts.
"""

from __future__ import annotations

import io
import posixpath
import zipfile
import zlib
from typing import Optional
from xml.parsers import expat

from engine.documents.document import DocumentError, Extracted, Tick, named, too_much_text

MAX_XML_BYTES = 256 << 20  # inflated XML read in all (declared sizes, checked before parsing)
MAX_RELS_BYTES = 4 << 20  # a relationships part
CHUNK = 1 << 16  # bytes of XML fed to the parser at a time (a tick each)

_NS = {
    "http://schemas.openxmlformats.org/wordprocessingml/2006/main": "w",
    "http://purl.oclc.org/ooxml/wordprocessingml/main": "w",  # Strict OOXML
    "http://schemas.openxmlformats.org/officeDocument/2006/relationships": "r",
    "http://purl.oclc.org/ooxml/officeDocument/relationships": "r",
    "http://schemas.openxmlformats.org/markup-compatibility/2006": "mc",
    "http://schemas.openxmlformats.org/officeDocument/2006/math": "m",
    "http://purl.oclc.org/ooxml/officeDocument/math": "m",
    "http://schemas.openxmlformats.org/drawingml/2006/main": "a",
    "http://purl.oclc.org/ooxml/drawingml/main": "a",
    "http://schemas.openxmlformats.org/drawingml/2006/picture": "pic",
    "urn:schemas-microsoft-com:vml": "v",
    "http://schemas.openxmlformats.org/package/2006/relationships": "rel",
}
_GRAPHICS = {"chart": "chart", "diagram": "SmartArt diagram", "picture": None}  # graphicData uri tail
_PLURALS = {"hidden text run": "hidden text runs", "symbol-font character": "symbol-font characters",
            "embedded document": "embedded documents", "SmartArt diagram": "SmartArt diagrams"}
_NOT_READ = {"m:oMathPara": "equation", "m:oMath": "equation", "w:object": "embedded object",
             "w:altChunk": "embedded document"}
_SKIPPED = frozenset({"w:del", "w:moveFrom", "w:delText", "w:instrText", "w:delInstrText", "w:sdtPr", "mc:Fallback",
                      "w:rPrChange", "w:pPrChange", "w:sectPrChange", "w:tblPrChange", "w:trPrChange",
                      "w:tcPrChange"})
_CHARS = {"w:tab": "\t", "w:ptab": "\t", "w:br": "\n", "w:cr": "\n", "w:noBreakHyphen": "-"}
_NOTE_SEPARATORS = frozenset({"separator", "continuationSeparator", "continuationNotice"})
_OFF = frozenset({"0", "false", "off"})
_REL = "http://schemas.openxmlformats.org/officeDocument/2006/relationships/"
_STRICT_REL = "http://purl.oclc.org/ooxml/officeDocument/relationships/"


def read_docx(name: str, data: bytes, chars: int, tick: Tick) -> Extracted:
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise DocumentError(name, f"not a readable .docx ({type(e).__name__}: {e})") from None
    with zf:
        return _Package(name, zf, chars, tick).read()


class _Package:
    """The parts of one .docx: the main document, its notes, headers and footers."""

    def __init__(self, name: str, zf: zipfile.ZipFile, chars: int, tick: Tick) -> None:
        self.name, self.zf, self.tick = name, zf, tick
        self.budget = _Budget(name, chars)
        self.unread: dict[str, int] = {}

    def read(self) -> Extracted:
        main = self._main_part()
        rels = self._relationships(main)
        parts = [main] + [t for kind, t in rels.values() if kind in ("header", "footer", "footnotes", "endnotes")]
        total = sum(self._info(p).file_size for p in dict.fromkeys(parts) if self._has(p))
        if total > MAX_XML_BYTES:
            raise DocumentError(self.name, f"its XML inflates to {total / 2**20:,.0f} MiB "
                                           f"(at most {MAX_XML_BYTES >> 20} MiB are read)")
        body = _Story(self.budget, self.unread)
        self._parse(main, body)
        footnotes = self._notes(rels, "footnotes", body.footnotes, str)
        endnotes = self._notes(rels, "endnotes", body.endnotes, _roman)
        headers = self._margins(rels, body.headers)
        footers = self._margins(rels, body.footers)
        sections = [*headers, "\n".join(body.lines), footnotes, endnotes, *footers]
        return Extracted("\n\n".join(s for s in sections if s), None, named(self.unread, _PLURALS))

    def _has(self, part: str) -> bool:
        try:
            self.zf.getinfo(part)
            return True
        except KeyError:
            return False

    def _info(self, part: str) -> zipfile.ZipInfo:
        try:
            return self.zf.getinfo(part)
        except KeyError:
            raise DocumentError(self.name, f"not a readable .docx (it has no part {part!r})") from None

    def _main_part(self) -> str:
        """The main document part, as the package's relationships name it."""
        main = next((t for kind, t in self._rels_of("_rels/.rels", "").values() if kind == "officeDocument"),
                    "word/document.xml")
        if not self._has(main):
            if not self._has("[Content_Types].xml"):
                raise DocumentError(self.name, "a zip archive, not a Word document (.docx)")
            raise DocumentError(self.name, "not a Word document (.docx): an Office file of another kind?")
        return main

    def _relationships(self, part: str) -> dict[str, tuple[str, str]]:
        folder, base = posixpath.split(part)
        return self._rels_of(posixpath.join(folder, "_rels", base + ".rels"), folder)

    def _rels_of(self, rels_part: str, folder: str) -> dict[str, tuple[str, str]]:
        """Id -> (relationship type's last word, the target part's path) of internal targets."""
        if not self._has(rels_part):
            return {}
        size = self._info(rels_part).file_size
        if size > MAX_RELS_BYTES:
            raise DocumentError(self.name, f"its relationships ({rels_part}) inflate to {size:,} bytes "
                                           f"(at most {MAX_RELS_BYTES:,} are read)")
        out: dict[str, tuple[str, str]] = {}

        def start(name: str, attrs: dict[str, str]) -> None:
            if _short(name) == "rel:Relationship" and attrs.get("TargetMode") != "External":
                kind = attrs.get("Type", "").rpartition("/")[2]
                target = attrs.get("Target", "")
                path = target[1:] if target.startswith("/") else posixpath.normpath(posixpath.join(folder, target))
                out[attrs.get("Id", "")] = (kind, path)

        self._expat(rels_part, start, lambda tag: None, None)
        return out

    def _parse(self, part: str, story: "_Story") -> None:
        self._expat(part, story.start, story.end, story.chars)

    def _notes(self, rels: dict[str, tuple[str, str]], kind: str, order: list[str], mark: object) -> str:
        """The referenced footnotes (or endnotes), `[n] text` one a line, in reference order."""
        part = next((t for k, t in rels.values() if k == kind), None)
        if not order or part is None or not self._has(part):
            return ""
        story = _Story(self.budget, self.unread, notes=True)
        self._parse(part, story)
        lines = []
        for n, note_id in enumerate(order, 1):
            text = "\n".join(story.notes.get(note_id, [])).strip()
            lines.append(f"[{mark(n)}] {text}".rstrip())  # type: ignore[operator]
        return "\n".join(lines)

    def _margins(self, rels: dict[str, tuple[str, str]], ids: list[str]) -> list[str]:
        """Each distinct header (or footer) text, in the order the sections reference them."""
        texts: list[str] = []
        for part in dict.fromkeys(rels[i][1] for i in ids if i in rels):
            if self._has(part):
                story = _Story(self.budget, self.unread)
                self._parse(part, story)
                text = "\n".join(story.lines).strip("\n")
                if text.strip() and text not in texts:
                    texts.append(text)
        return texts

    def _expat(self, part: str, start: object, end: object, chars: object) -> None:
        """Parse `part` with expat, a chunk at a time: `start(name, attrs)` and `end(name)` get
        expat's 'uri local' names (`_short` makes them 'w:p'), `chars` the text."""
        parser = expat.ParserCreate(namespace_separator=" ")
        parser.buffer_text = True
        parser.buffer_size = CHUNK
        parser.StartElementHandler = start
        parser.EndElementHandler = end
        if chars is not None:
            parser.CharacterDataHandler = chars

        def no_dtd(*_: object) -> None:
            raise DocumentError(self.name, f"not a readable .docx ({part} declares a DOCTYPE, which Word never writes)")

        parser.StartDoctypeDeclHandler = no_dtd
        parser.EntityDeclHandler = no_dtd
        try:
            with self.zf.open(self._info(part)) as f:
                while chunk := f.read(CHUNK):
                    self.tick()
                    parser.Parse(chunk, False)
                parser.Parse(b"", True)
        except DocumentError:
            raise
        except expat.ExpatError as e:
            raise DocumentError(self.name, f"not a readable .docx ({part}: {e})") from None
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError, RuntimeError, ValueError) as e:
            raise DocumentError(self.name, f"not a readable .docx ({part}: {type(e).__name__}: {e})") from None


_NAMES: dict[str, str] = {}  # expat's 'uri local' -> 'w:p', for every name seen


def _short(name: str) -> str:
    """An expat name ('uri local') as 'w:p' (an unknown namespace as '?:local')."""
    got = _NAMES.get(name)
    if got is None:
        uri, _, local = name.rpartition(" ")
        got = f"{_NS.get(uri, '?')}:{local}" if uri else local
        if len(_NAMES) < 4096:  # a hostile file's endless new names are not all kept
            _NAMES[name] = got
    return got


class _Budget:
    """The characters read so far, across every part of the document."""

    def __init__(self, name: str, chars: int) -> None:
        self.name, self.chars, self.used = name, chars, 0

    def take(self, n: int) -> None:
        self.used += n
        if self.used > self.chars:
            raise too_much_text(self.name, self.used, self.chars, more=True)


class _Paragraph:
    __slots__ = ("parts", "after")

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.after: list[str] = []  # text boxes anchored in it: their lines come after it


class _Story:
    """One part's text in document order (the body, a header, the footnotes), from expat's events."""

    def __init__(self, budget: _Budget, unread: dict[str, int], notes: bool = False) -> None:
        self.budget, self.unread, self.notes_part = budget, unread, notes
        self.lines: list[str] = []
        self.containers: list[list[str]] = [self.lines]  # the story, table cells, text boxes
        self.rows: list[tuple[list[str], list[bool]]] = []  # each open table row: its cells, deleted?
        self.paras: list[_Paragraph] = []
        self.tags: list[str] = []
        self.skip = 0  # depth inside a skipped element
        self.alternates: list[bool] = []  # each open mc:AlternateContent: a choice taken already?
        self.fields: list[bool] = []  # each open complex field: in its code (True) or its result
        self.in_run = self.in_run_props = self.hidden = self.capture = False
        self.hidden_counted = False
        self.footnotes: list[str] = []  # note ids in reference order
        self.endnotes: list[str] = []
        self.headers: list[str] = []  # relationship ids, as sections reference them
        self.footers: list[str] = []
        self.notes: dict[str, list[str]] = {}  # (notes parts) note id -> its lines
        self.note: Optional[str] = None

    # -- expat's handlers

    def start(self, name: str, attrs: dict[str, str]) -> None:
        if self.skip:
            self.skip += 1
            return
        tag = _NAMES.get(name) or _short(name)
        if attrs:
            attrs = {_short(k): v for k, v in attrs.items()}
        parent = self.tags[-1] if self.tags else ""
        self.tags.append(tag)
        if tag in _SKIPPED:
            if tag == "w:del" and parent == "w:trPr" and self.rows:
                self.rows[-1][1][0] = True  # a deleted table row
            self._skip()
            return
        if tag in _NOT_READ:
            self._count(_NOT_READ[tag])
            self._skip()
            return
        if tag == "w:p":
            self.paras.append(_Paragraph())
        elif tag == "w:r":
            self.in_run, self.hidden, self.hidden_counted = True, False, False
        elif tag == "w:rPr":
            self.in_run_props = self.in_run
        elif tag == "w:vanish":
            if self.in_run_props and attrs.get("w:val", "1").lower() not in _OFF:
                self.hidden = True
        elif tag == "w:t":
            self.capture = self._shown()
        elif tag in _CHARS:
            if self._shown():
                self._add(_CHARS[tag])
        elif tag == "w:sym":
            self._symbol(attrs.get("w:char", ""))
        elif tag == "w:fldChar":
            kind = attrs.get("w:fldCharType")
            if kind == "begin":
                self.fields.append(True)
            elif kind == "separate" and self.fields:
                self.fields[-1] = False
            elif kind == "end" and self.fields:
                self.fields.pop()
        elif tag == "w:tc":
            self.containers.append([])
        elif tag == "w:tr":
            self.rows.append(([], [False]))
        elif tag == "w:txbxContent":
            self.containers.append([])
        elif tag == "w:footnoteReference" or tag == "w:endnoteReference":
            self._reference(tag, attrs.get("w:id", ""))
        elif tag == "w:commentReference":
            self._count("comment")
        elif tag == "w:headerReference":
            self.headers.append(attrs.get("r:id", ""))
        elif tag == "w:footerReference":
            self.footers.append(attrs.get("r:id", ""))
        elif tag == "mc:AlternateContent":
            self.alternates.append(False)
        elif tag == "mc:Choice":
            if self.alternates and self.alternates[-1]:
                self._skip()  # another choice was read: the same content
            elif self.alternates:
                self.alternates[-1] = True
        elif tag == "a:graphicData":
            kind = attrs.get("uri", "").rpartition("/")[2]
            if _GRAPHICS.get(kind, "") != "":
                self._count(_GRAPHICS[kind] or "picture")
        elif tag == "v:imagedata":
            self._count("picture")
        elif self.notes_part and tag in ("w:footnote", "w:endnote"):
            if attrs.get("w:type") in _NOTE_SEPARATORS:
                self._skip()
            else:
                self.note = attrs.get("w:id", "")
                self.containers.append([])

    def end(self, name: str) -> None:
        if self.skip:
            self.skip -= 1
            if self.skip:
                return
        tag = self.tags.pop()
        if tag == "w:t":
            self.capture = False
        elif tag == "w:p":
            p = self.paras.pop()
            self._line("".join(p.parts))
            for line in p.after:
                self._line(line)
        elif tag == "w:r":
            self.in_run = self.hidden = False
        elif tag == "w:rPr":
            self.in_run_props = False
        elif tag == "w:tc":
            text = "\n".join(self.containers.pop())
            if self.rows:
                self.rows[-1][0].append(text)
            else:
                self._line(text)
        elif tag == "w:tr":
            cells, deleted = self.rows.pop()
            if not deleted[0]:
                self._line(" | ".join(cells))
        elif tag == "w:txbxContent":
            lines = self.containers.pop()
            if self.paras:
                self.paras[-1].after.extend(lines)
            else:
                for line in lines:
                    self._line(line)
        elif tag == "mc:AlternateContent":
            self.alternates.pop()
        elif self.notes_part and tag in ("w:footnote", "w:endnote") and self.note is not None:
            self.notes[self.note] = self.containers.pop()
            self.note = None

    def chars(self, data: str) -> None:
        if self.capture and not self.skip:
            self._add(data)

    # -- helpers

    def _skip(self) -> None:
        self.skip = 1

    def _shown(self) -> bool:
        """Whether a run's text here is shown: not hidden, not inside a field's code."""
        if any(self.fields):
            return False
        if self.hidden:
            if not self.hidden_counted:
                self._count("hidden text run")
                self.hidden_counted = True
            return False
        return True

    def _add(self, text: str) -> None:
        self.budget.take(len(text))
        if self.paras:
            self.paras[-1].parts.append(text)
        else:  # text outside any paragraph (not valid Word, read anyway): a line of its own
            self._line(text)

    def _line(self, line: str) -> None:
        self.budget.take(1)
        self.containers[-1].append(line)

    def _count(self, what: str) -> None:
        self.unread[what] = self.unread.get(what, 0) + 1

    def _symbol(self, code: str) -> None:
        try:
            ch = int(code, 16)
        except ValueError:
            return
        if 0xF000 <= ch <= 0xF0FF or not 0 < ch < 0x110000:  # a symbol font's own glyph: no Unicode meaning
            self._count("symbol-font character")
        elif self._shown():
            self._add(chr(ch))

    def _reference(self, tag: str, note_id: str) -> None:
        order = self.footnotes if tag == "w:footnoteReference" else self.endnotes
        order.append(note_id)
        n = len(order)
        if self._shown():
            self._add(f"[{n if order is self.footnotes else _roman(n)}]")


def _roman(n: int) -> str:
    """Endnote marks as Word numbers them by default: i, ii, iii, iv..."""
    out = ""
    for value, letters in ((1000, "m"), (900, "cm"), (500, "d"), (400, "cd"), (100, "c"), (90, "xc"), (50, "l"),
                           (40, "xl"), (10, "x"), (9, "ix"), (5, "v"), (4, "iv"), (1, "i")):
        while n >= value:
            out += letters
            n -= value
    return out
