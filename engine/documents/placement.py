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
from typing import Any, Callable, Optional, Sequence

from engine.documents.document import MAX_DOCUMENTS, Document, shown_name
from engine.errors import RequestError

Message = dict[str, Any]  # an OpenAI-style chat message (engine.types.Message, a layer above)

SEPARATOR = "\n\n"


def block(doc: Document) -> str:
    """A document as the model reads it (its name with no control or bidirectional-override
    character raw: extract.shown_name)."""
    name = shown_name(doc.name.replace("\n", " ")).replace('"', "'")
    return f'<document name="{name}">\n{doc.text}\n</document>'


def place(messages: Sequence[Message], documents: Sequence[Document]) -> list[Message]:
    """The conversation with the documents at the end of its system message; more than
    MAX_DOCUMENTS is refused (the disk cache keeps no state naming more)."""
    out = [dict(m) for m in messages]
    if not documents:
        return out
    if len(documents) > MAX_DOCUMENTS:
        raise RequestError(f"{len(documents)} documents in one request: at most {MAX_DOCUMENTS}", "documents")
    blocks = SEPARATOR.join(block(d) for d in documents)
    if out and out[0].get("role") == "system" and isinstance(out[0].get("content"), str) and out[0]["content"]:
        out[0]["content"] = out[0]["content"] + SEPARATOR + blocks
    else:
        if out and out[0].get("role") == "system":
            out = out[1:]  # an empty system prompt: the documents are the system message
        out.insert(0, {"role": "system", "content": blocks})
    return out


Encode = Callable[[str, int], Sequence[int]]  # (a prefix of the rendered prompt, where content starts in it) -> ids


@dataclass
class DocumentSpan:
    """Where a placed document lies in the prompt's tokens: [start, end), the separator before its
    block included (when something precedes it in the system message), so `tokens` is what the
    document adds to the prompt: its cost (`document_costs`). `end` is a cut of the canonical
    schedule when `cut` (False: the tokenizer merged across its end, or the template rewrote it,
    so the prompt has no boundary there). `unread`: what the file holds that is not in its text
    (Document.unread), reported with the span."""

    name: str
    digest: str
    start: int
    end: int
    cut: bool
    unread: tuple[str, ...] = ()

    @property
    def tokens(self) -> int:
        return self.end - self.start


def document_spans(encode: Encode, placed: Sequence[Message], documents: Sequence[Document],
                   prompt: Sequence[int], text: Optional[str]) -> list[DocumentSpan]:
    """Each document's token span in `prompt` (the placed conversation's tokens; `text` its
    rendered text). `encode` gives a prefix of `text` as the prompt encodes it: the template's
    control tokens before the system message's content, the content as text (a control token's
    text in a document stays text: templating.encode_prefix). A span end is a cut when the text
    up to it encodes to a prefix of `prompt`."""
    if not documents or not isinstance(text, str):
        return []
    system = placed[0]["content"]
    at = text.find(system)
    if at < 0:  # a template that rewrites the system prompt: no document boundaries
        return []
    spans: list[DocumentSpan] = []
    for doc, (start_char, end_char) in zip(documents, _parts(system, documents, at)):
        start, _ = _tokens_before(encode(text[:start_char], at), prompt)
        end, end_ok = _tokens_before(encode(text[:end_char], at), prompt)
        spans.append(DocumentSpan(doc.name, doc.digest, start, end, end_ok and end > start, doc.unread))
    return spans


def document_costs(encode: Encode, placed: Sequence[Message], documents: Sequence[Document],
                   prompt: Sequence[int], text: Optional[str]) -> list[int]:
    """What each document costs in `prompt` (the placed conversation's tokens; `text` its rendered
    text): the tokens its part of the system message takes, its named block and the separator
    before it. The one count the report's spans, a refusal's sizes and `Engine.document_tokens`
    (what the window's chips show) give. A template that rewrites the system prompt leaves no
    spans: then each part's text, encoded alone."""
    spans = document_spans(encode, placed, documents, prompt, text)
    if len(spans) == len(documents):
        return [s.tokens for s in spans]
    system = placed[0]["content"]
    return [len(encode(system[a:b], 0)) for a, b in _parts(system, documents)]


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


def _tokens_before(ids: Sequence[int], prompt: Sequence[int]) -> tuple[int, bool]:
    """How many of the prompt's tokens a prefix (`ids`) is, and whether it is exactly a prefix of
    them (the tokenizer did not merge across its end)."""
    ok = 0 < len(ids) < len(prompt) and list(prompt[: len(ids)]) == list(ids)
    return len(ids), ok
