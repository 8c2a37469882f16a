"""Where a search's words are in a text: what the sidebar's snippet and the revealed message
mark. The same matching as the store's search (app/core/store/conversations.py): each word of
the query, case-insensitive, as a word or a word's start."""

from __future__ import annotations

import re
from html import escape


def search_terms(query: str) -> list[str]:
    """The words of a query, as the store's search reads it."""
    return re.findall(r"\w+", query.casefold())


def term_spans(text: str, terms: list[str]) -> list[tuple[int, int]]:
    """(start, end) of each match of a term in `text`: a word starting with it, the part matched."""
    if not terms:
        return []
    pattern = re.compile(r"(?<!\w)(?:" + "|".join(re.escape(t) for t in sorted(terms, key=len, reverse=True)) + ")",
                         re.IGNORECASE)  # fmt: skip
    return [m.span() for m in pattern.finditer(text)]


MARK_STYLE = "background-color:#ffd84d;color:#000000"  # a marker pen's yellow, legible in both themes


def marked_html(text: str, terms: list[str]) -> str:
    """`text` escaped for rich text, each match of a term in a marked span."""
    out, last = [], 0
    for a, b in term_spans(text, terms):
        out += [escape(text[last:a]), f"<span style='{MARK_STYLE}'>", escape(text[a:b]), "</span>"]
        last = b
    out.append(escape(text[last:]))
    return "".join(out).replace("\n", "<br>")
