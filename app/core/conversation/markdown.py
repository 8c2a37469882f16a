"""Model output as safe HTML for Qt's rich-text engine.

Model text is untrusted: raw HTML is escaped (markdown-it with html=False), links only keep
http(s)/mailto targets, images become plain links (nothing is ever fetched), and the view
refuses every resource load (see chat_view.MessageBody.loadResource). Fenced code blocks are
highlighted with Pygments inline styles (Qt ignores CSS classes) and get a "Copy" link whose
`copy:N` target indexes `Rendered.code_blocks`. No Qt import here, so it is testable alone.

While a reply streams it is re-rendered on every update (<= 20 per second), and highlighting is
what costs: 6.6k characters of Python took 23 ms in Pygments plus 30 ms of Qt layout for the
styled spans, against 0.4 + 8 ms plain (bench/gui_latency.py, "code" rows). So while streaming,
the block still being written is plain, and complete blocks are highlighted while their total
stays within STREAM_HIGHLIGHT_CHARS; the rest is highlighted once the reply is complete. So a block
changes at most once, from plain to coloured. Highlighted blocks are cached: a re-render highlights
only code it has not seen.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from markdown_it import MarkdownIt

SAFE_SCHEMES = ("http://", "https://", "mailto:")
STREAM_HIGHLIGHT_CHARS = 1500  # code highlighted per streaming update (bench item 5 sizes it)


@dataclass(frozen=True)
class Palette:
    """The colours rendering needs (theme.Theme provides one)."""

    text: str = "#1f2328"
    muted: str = "#656d76"
    link: str = "#0969da"
    code_bg: str = "#f6f8fa"
    code_head: str = "#eaeef2"  # the band above a code block (language, Copy)
    code_border: str = "#d0d7de"
    inline_code_bg: str = "#eff1f3"
    quote: str = "#656d76"
    pygments_style: str = "default"
    mono: str = "Menlo, 'DejaVu Sans Mono', 'Noto Mono', monospace"


@dataclass
class Rendered:
    html: str
    code_blocks: list[str] = field(default_factory=list)


@lru_cache(maxsize=1)
def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.enable(["table", "strikethrough"])
    return md


# A tool call in the JSON markup of Qwen-style templates (mlx-lm's json_tools format), as a reply
# made for an agent carries it (an imported or exported conversation): shown as a call.
_TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def tool_calls_as_markdown(text: str) -> str:
    """Each `<tool_call>{"name": ..., "arguments": ...}</tool_call>` as a labelled JSON block
    ("Tool call: `name`" and its arguments), not raw markup; a body that does not parse is shown
    as it is, in a block of its own."""

    def one(m: "re.Match[str]") -> str:
        body = m.group(1)
        try:
            call = json.loads(body)
            name, args = call["name"], call.get("arguments", {})
            if isinstance(args, str):
                args = json.loads(args)
            shown = json.dumps(args, indent=2, ensure_ascii=False)
        except (ValueError, KeyError, TypeError):
            return f"\n\n**Tool call**\n\n```\n{body}\n```\n\n"
        return f"\n\n**Tool call:** `{name}`\n\n```json\n{shown}\n```\n\n"

    return _TOOL_CALL_RE.sub(one, text) if "<tool_call>" in text else text


def render(text: str, palette: Palette = Palette(), streaming: bool = False) -> Rendered:
    """Markdown -> HTML. `streaming` appends a cursor (an unclosed fence renders as code)."""
    md = _parser()
    text = tool_calls_as_markdown(text)
    tokens = md.parse(text)
    out = Rendered("")
    lines = text.split("\n")
    budget = STREAM_HIGHLIGHT_CHARS  # while streaming: code this render may still highlight

    def code(tok: Any, info: str) -> str:
        nonlocal budget
        if not streaming and tok.type == "fence" and not tok.content.strip() and not _complete(tok, lines):
            # A finished reply that ends on an opening fence (cut off, or a stray ```): the fence
            # as text, not an empty code block with a Copy link.
            return f"<p>{html.escape(tok.markup + tok.info)}</p>"
        colour = True
        if streaming:  # complete blocks in order while they fit; then (and the open block) plain
            size = len(tok.content.rstrip("\n"))
            colour = size <= budget and _complete(tok, lines)
            budget = budget - size if colour else 0
        return _code_block(tok.content, info, palette, out, colour)

    renderer = md.renderer
    rules: dict[str, Any] = {
        "fence": lambda toks, i, opts, env: code(toks[i], toks[i].info),
        "code_block": lambda toks, i, opts, env: code(toks[i], ""),
        "code_inline": lambda toks, i, opts, env: (
            f'<code style="background-color:{palette.inline_code_bg}; font-family:{palette.mono}">'
            f"{html.escape(toks[i].content)}</code>"
        ),
        "image": lambda toks, i, opts, env: _image(toks[i], palette),
        "link_open": lambda toks, i, opts, env: _link_open(toks[i], palette, env),
        "link_close": lambda toks, i, opts, env: "</a>" if env["links"].pop() else "</span>",
        "blockquote_open": lambda toks, i, opts, env: f'<blockquote style="color:{palette.quote}">',
        "table_open": lambda toks, i, opts, env: (
            f'<table cellspacing="0" cellpadding="4" border="1" style="border-color:{palette.code_border};'
            ' border-collapse:collapse">'
        ),
    }
    saved = {k: renderer.rules.get(k) for k in rules}
    renderer.rules.update(rules)  # per call: the parser is shared, so restore afterwards
    try:
        body = renderer.render(tokens, md.options, {"links": []})
    finally:
        for k, v in saved.items():
            if v is None:
                renderer.rules.pop(k, None)
            else:
                renderer.rules[k] = v
    if streaming:
        body += f'<span style="color:{palette.muted}">▍</span>'
    out.html = body
    return out


def _link_open(tok: Any, palette: Palette, env: dict[str, Any]) -> str:
    href = str(tok.attrGet("href") or "")
    safe = href.lower().startswith(SAFE_SCHEMES)
    env["links"].append(safe)
    if not safe:
        return "<span>"  # keep the text, drop the target (javascript:, file:, relative paths...)
    return f'<a href="{html.escape(href, quote=True)}" style="color:{palette.link}">'


def _image(tok: Any, palette: Palette) -> str:
    """Never load an image: show its alt text, linked when the target is http(s)."""
    src = str(tok.attrGet("src") or "")
    alt = html.escape("".join(c.content for c in (tok.children or [])) or "image")
    if src.lower().startswith(("http://", "https://")):
        return f'<a href="{html.escape(src, quote=True)}" style="color:{palette.link}">[image: {alt}]</a>'
    return f"[image: {alt}]"


def _complete(tok: Any, lines: list[str]) -> bool:
    """Whether a code block can no longer grow: a fence with its closing line, or an indented
    block with text after it."""
    if not tok.map:
        return True
    start, end = tok.map
    if tok.type != "fence":
        return any(line.strip() for line in lines[end:])
    last = lines[end - 1].strip() if end - 1 < len(lines) else ""
    return end - start >= 2 and len(last) >= len(tok.markup) and set(last) == {tok.markup[0]}


def _code_block(code: str, info: str, palette: Palette, out: Rendered, colour: bool) -> str:
    index = len(out.code_blocks)
    code = code.rstrip("\n")
    out.code_blocks.append(code)
    lang = (info or "").strip().split()[0] if (info or "").strip() else ""
    body = highlight(code, lang, palette.pygments_style) if colour else html.escape(code)
    label = html.escape(lang) if lang else "code"
    head = f"background-color:{palette.code_head}; font-size:small"
    return (
        f'<table width="100%" cellspacing="0" cellpadding="6" border="0" '
        f'style="background-color:{palette.code_bg}; margin-top:4px; margin-bottom:8px">'
        f'<tr><td style="{head}; color:{palette.muted}">{label}</td>'
        f'<td align="right" style="{head}"><a href="copy:{index}" '
        f'style="color:{palette.link}; text-decoration:none">Copy</a></td></tr>'
        f'<tr><td colspan="2"><pre style="font-family:{palette.mono}; white-space:pre-wrap; '
        f'margin:0">{body}</pre></td></tr></table>'
    )


@lru_cache(maxsize=64)
def highlight(code: str, lang: str, style: str) -> str:
    """Pygments with inline styles; plain escaped text when the language is unknown."""
    try:
        from pygments import highlight as pyg_highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import get_lexer_by_name
        from pygments.util import ClassNotFound
    except ImportError:  # Pygments is optional: unhighlighted but still escaped
        return html.escape(code)
    if not lang:
        return html.escape(code)
    try:
        lexer = get_lexer_by_name(lang, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return html.escape(code)
    formatter = _formatter(style)
    return pyg_highlight(code, lexer, formatter).rstrip("\n")


@lru_cache(maxsize=4)
def _formatter(style: str) -> Any:
    from pygments.formatters import HtmlFormatter

    # nowrap: we supply our own <pre>; noclasses: Qt understands inline style attributes only.
    return HtmlFormatter(nowrap=True, noclasses=True, style=style)
