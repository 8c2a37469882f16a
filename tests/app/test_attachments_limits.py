"""The window's attachments read within limits, and their chips name what was not read (issue 49):
app/core/composer/attachments.py, Qt-free."""

from __future__ import annotations

from pathlib import Path

from app.core.composer.attachments import read_files
from tests import hostile_files as H


def test_the_window_reads_attachments_within_limits_and_names_each_refusal(tmp_path: Path) -> None:
    """A .docx that inflates past what the reader takes is refused at once, naming it, and the
    good file beside it is attached (before, python-docx inflated all of it in the window's
    process)."""
    bomb, good = tmp_path / "bomb.docx", tmp_path / "notes.docx"
    bomb.write_bytes(H.docx_inflating_to(300 << 20))
    good.write_bytes(H.word(H.p("Clause 1.")))
    docs, refused = read_files([str(bomb), str(good)])
    assert [d.name for d in docs] == ["notes.docx"] and docs[0].text == "Clause 1."
    assert len(refused) == 1 and refused[0].startswith("bomb.docx: its XML inflates to 300 MiB"), refused


def test_a_chip_names_what_the_file_holds_and_is_not_read_and_shows_its_name_escaped() -> None:
    from app.core.composer.attachments import Attachment
    from engine.documents.bounded import read_bytes

    data = H.word(H.p("Area: ", "<m:oMath><m:r><m:t>x</m:t></m:r></m:oMath>",
                      '<w:r><w:commentReference w:id="1"/></w:r>'))
    a = Attachment(read_bytes("r\x1b[2J\u202eformula.docx", data), tokens=12)
    assert a.chip == "r\\x1b[2J\\u202eformula.docx · 12 tokens · not read: 1 comment, 1 equation"
    assert "Not read (the model does not see them): 1 comment, 1 equation." in a.tooltip
    assert "\x1b" not in a.tooltip and "\u202e" not in a.tooltip
