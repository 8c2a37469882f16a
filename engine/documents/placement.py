"""Where documents go in the prompt, so that every conversation about them shares their state.

Documents are placed at one fixed place: at the end of the system message (one is added when
the conversation has none), after the system prompt, in attach order, each a block with its name:

    <system prompt>\\n\\n<document name="a.pdf">\\n...text...\\n</document>\\n\\n<document name="b.md">...

Every message after the system message comes later in the prompt, so two conversations with the
same system prompt and the same documents render the same tokens up to the last document's end,
whatever is asked after. The canonical schedule cuts at the end of each block
(`document_cuts`): the cuts before it are the same in both conversations (chunk multiples, and
no message starts inside the system message), so the state there is bit-identical and the prompt
cache restores it in exact mode (engine/cache/planner.py: exact_at) in any conversation, from
memory or disk. A template that places the system prompt inside the first user turn (Gemma)
keeps that property: the documents still end before anything the user wrote.

A document attached mid-conversation is placed there too: the earlier turns' cached state from the
system message on is no longer a prefix, so the next reply prefills the conversation again once
(the window says so before sending); from then on it is shared like any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from engine.documents.extract import Document

Message = dict[str, Any]  # an OpenAI-style chat message (engine.types.Message, a layer above)

SEPARATOR = "\n\n"


def block(doc: Document) -> str:
    """A document as the model reads it."""
    name = doc.name.replace('"', "'").replace("\n", " ")
    return f'<document name="{name}">\n{doc.text}\n</document>'


def place(messages: Sequence[Message], documents: Sequence[Document]) -> list[Message]:
    """The conversation with the documents at the end of its system message."""
    out = [dict(m) for m in messages]
    if not documents:
        return out
    blocks = SEPARATOR.join(block(d) for d in documents)
    if out and out[0].get("role") == "system" and isinstance(out[0].get("content"), str) and out[0]["content"]:
        out[0]["content"] = out[0]["content"] + SEPARATOR + blocks
    else:
        if out and out[0].get("role") == "system":
            out = out[1:]  # an empty system prompt: the documents are the system message
        out.insert(0, {"role": "system", "content": blocks})
    return out


@dataclass
class DocumentSpan:
    """Where a placed document lies in the prompt's tokens: [start, end), the separator before its
    block included (when something precedes it in the system message), so `tokens` is what the
    document adds to the prompt: its cost (`document_costs`). `end` is a cut of the canonical
    schedule when `cut` (False: the tokenizer merged across its end, or the template rewrote it,
    so the prompt has no boundary there)."""

    name: str
    digest: str
    start: int
    end: int
    cut: bool

    @property
    def tokens(self) -> int:
        return self.end - self.start


def document_spans(tokenizer: Any, placed: Sequence[Message], documents: Sequence[Document],
                   prompt: Sequence[int], text: Optional[str]) -> list[DocumentSpan]:
    """Each document's token span in `prompt` (the placed conversation's tokens; `text` its
    rendered text). A span end is a cut when the text up to it encodes to a prefix of `prompt`."""
    if not documents or not isinstance(text, str):
        return []
    system = placed[0]["content"]
    at = text.find(system)
    if at < 0:  # a template that rewrites the system prompt: no document boundaries
        return []
    spans: list[DocumentSpan] = []
    for doc, (start_char, end_char) in zip(documents, _parts(system, documents, at)):
        start, _ = _tokens_before(tokenizer, text[:start_char], prompt)
        end, end_ok = _tokens_before(tokenizer, text[:end_char], prompt)
        spans.append(DocumentSpan(doc.name, doc.digest, start, end, end_ok and end > start))
    return spans


def document_costs(tokenizer: Any, placed: Sequence[Message], documents: Sequence[Document],
                   prompt: Sequence[int], text: Optional[str]) -> list[int]:
    """What each document costs in `prompt` (the placed conversation's tokens; `text` its rendered
    text): the tokens its part of the system message takes, its named block and the separator
    before it. The one count the report's spans, a refusal's sizes and `Engine.document_tokens`
    (what the window's chips show) give. A template that rewrites the system prompt leaves no
    spans: then each part's text, encoded alone."""
    spans = document_spans(tokenizer, placed, documents, prompt, text)
    if len(spans) == len(documents):
        return [s.tokens for s in spans]
    system = placed[0]["content"]
    return [len(tokenizer.encode(system[a:b], add_special_tokens=False)) for a, b in _parts(system, documents)]


def _parts(system: str, documents: Sequence[Document], at: int = 0) -> list[tuple[int, int]]:
    """Each document's [start, end) in characters, offset by `at`, in `system` (the placed system
    message's text, which the documents end): its block and the separator before it, when
    anything precedes the block."""
    out = []
    pos = len(system) - len(SEPARATOR.join(block(d) for d in documents))
    for doc in documents:
        lead = len(SEPARATOR) if pos > 0 else 0
        out.append((at + pos - lead, at + pos + len(block(doc))))
        pos += len(block(doc)) + len(SEPARATOR)
    return out


def _tokens_before(tokenizer: Any, prefix: str, prompt: Sequence[int]) -> tuple[int, bool]:
    """How many of the prompt's tokens `prefix` is, and whether it is exactly a prefix of them
    (the tokenizer did not merge across its end)."""
    ids = list(tokenizer.encode(prefix, add_special_tokens=False))
    ok = 0 < len(ids) < len(prompt) and list(prompt[: len(ids)]) == ids
    return len(ids), ok
