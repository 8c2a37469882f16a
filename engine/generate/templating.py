"""Messages to prompt token ids with the model's own chat template, and streamed text."""

from __future__ import annotations

import json
from typing import Any, Optional, Sequence

from engine.constraint import template_messages
from engine.errors import RequestError
from engine.types import Message

Tools = Optional[Sequence[dict[str, Any]]]  # OpenAI tool definitions, handed to the template as is


def render_prompt(tokenizer: Any, messages: Sequence[Message], add_generation_prompt: bool = True,
                  tools: Tools = None) -> list[int]:
    """Token ids of the conversation, by default with the generation prompt added (ready for a
    reply). `tools` go to the chat template as transformers passes them (`tools=`), and tool-call
    arguments as objects (engine/constraint.py: template_messages)."""
    if getattr(tokenizer, "chat_template", None):
        extra = {"tools": list(tools)} if tools else {}
        try:
            ids = tokenizer.apply_chat_template(template_messages(messages), add_generation_prompt=add_generation_prompt,
                                                tokenize=True, **extra)
        except Exception as e:  # jinja errors: e.g. a template that rejects a system message
            raise RequestError(f"the model's chat template rejected the conversation: {e}") from e
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        ids = list(ids)
        if ids and isinstance(ids[0], list):
            ids = ids[0]
    else:  # base models without a template: plain text, one turn per line
        text = "\n".join(f"{m['role']}: {m['content']}" for m in messages)
        if add_generation_prompt:
            text += "\nassistant:"
        ids = list(tokenizer.encode(text))
    if not ids:
        raise RequestError("the conversation rendered to an empty prompt")
    return [int(t) for t in ids]


class MessageStarts:
    """Where each rendered message starts in a prompt's tokens, and where each earlier reply's
    generation header ends: the canonical schedule's message cuts (cache/planner.py).

    The start of message i is the length of the conversation before it, rendered without a
    generation prompt, kept only if that is a prefix of the prompt (a template that rewrites
    history, or a tokenizer that merges across the seam, simply gives fewer cuts). The last
    entry is where the generation prompt starts: the next turn's reply starts there too.

    Reply header cuts (`reply_header_cuts`): for each assistant message i, G_i - 1, where G_i is
    the length of the conversation before it rendered *with* the generation prompt (turn i's own
    prompt), kept only if those G_i tokens are a prefix of the prompt. Turn i forwarded its
    header as the chunk [start of message i, G_i - 1) and then token G_i - 1 alone; a later turn
    that cuts there too forwards the header as the same chunk, so the state (and the disk
    block, engine/cache/blocks.py) of turn i's regenerate point is shared, not computed again.

    Renders are memoized by conversation prefix, so a growing chat renders only its new turns.
    """

    def __init__(self, tokenizer: Any, max_entries: int = 4096) -> None:
        self._tok = tokenizer
        self._memo: dict[tuple[str, ...], Optional[list[int]]] = {}
        self._max = max_entries

    def __call__(self, messages: Sequence[Message], prompt: Sequence[int], tools: Tools = None) -> list[int]:
        out: list[int] = []
        for i in range(1, len(messages) + 1):
            ids = self._render(messages[:i], tools, generation=False)
            if ids is not None and _is_prefix(ids, prompt):
                out.append(len(ids))
        return out

    def reply_header_cuts(self, messages: Sequence[Message], prompt: Sequence[int], tools: Tools = None) -> list[int]:
        """G_i - 1 for each assistant message i of `messages` whose turn's prompt (G_i tokens:
        the messages before it with the generation prompt) is a prefix of `prompt`."""
        out: list[int] = []
        for i, m in enumerate(messages):
            if i == 0 or m.get("role") != "assistant":
                continue
            ids = self._render(messages[:i], tools, generation=True)
            if ids is not None and len(ids) > 1 and _is_prefix(ids, prompt):
                out.append(len(ids) - 1)
        return out

    def _render(self, messages: Sequence[Message], tools: Tools, generation: bool) -> Optional[list[int]]:
        # Keyed by every key of every message (tool calls too), the tools the template shows and
        # whether the generation prompt is added.
        key = ("gen" if generation else "", json.dumps(list(tools or ()), sort_keys=True),
               *(json.dumps(m, sort_keys=True, ensure_ascii=False) for m in messages))
        if key not in self._memo:
            if len(self._memo) >= self._max:
                self._memo.pop(next(iter(self._memo)))
            try:
                self._memo[key] = render_prompt(self._tok, messages, add_generation_prompt=generation, tools=tools)
            except RequestError:
                self._memo[key] = None  # a template that will not render this prefix: no cut here
        return self._memo[key]


def _is_prefix(ids: Sequence[int], prompt: Sequence[int]) -> bool:
    """`ids` is a proper, non-empty prefix of `prompt`."""
    return 0 < len(ids) < len(prompt) and list(prompt[: len(ids)]) == list(ids)


def render_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of raw text (no chat template), with the BOS token if the tokenizer adds one."""
    if not isinstance(text, str):
        raise RequestError("prompt must be a string")
    ids = [int(t) for t in tokenizer.encode(text)]
    if not ids:
        raise RequestError("the prompt encoded to no tokens (the model's tokenizer adds no BOS token)")
    return ids


class TextStream:
    """Turns a growing token list into text deltas that never split a multi-byte character.

    Decodes the whole reply each step (fast tokenizers decode thousands of tokens in well under
    a decode step) so the deltas always concatenate to exactly `tokenizer.decode(tokens)`,
    whatever the tokenizer does with spaces at segment starts.
    """

    def __init__(self, tokenizer: Any, skip: set[int]) -> None:
        self._tok = tokenizer
        self._skip = skip
        self._ids: list[int] = []
        self.text = ""  # text emitted so far

    def decode(self) -> str:
        return self._tok.decode(self._ids)

    def add(self, token: int) -> str:
        if token in self._skip:
            return ""
        self._ids.append(token)
        full = self.decode()
        if full.endswith("\ufffd") or not full.startswith(self.text):
            return ""  # incomplete character (or a tokenizer that rewrites): wait for more
        delta = full[len(self.text) :]
        self.text = full
        return delta

    def flush(self) -> str:
        """The rest of the text at the end (an incomplete character is emitted as decoded)."""
        full = self.decode()
        if not full.startswith(self.text):
            return ""
        delta, self.text = full[len(self.text) :], full
        return delta


def token_pieces(tokenizer: Any, tokens: Sequence[int], window: int = 8) -> list[str]:
    """The text each token adds, for showing a reply token by token (one string per token).

    Each piece is decoded in a small window of preceding tokens (so a SentencePiece space or a
    character split across byte tokens comes out as the reply shows it) and costs O(window), so
    4k tokens take milliseconds. A token that completes no character yet gets "" and the token
    that completes it carries the whole character. Display only: the pieces join to the reply's
    text for ordinary tokenizers, but nothing relies on that.
    """
    out: list[str] = []
    ids = [int(t) for t in tokens]
    for i in range(len(ids)):
        start = max(0, i - window)
        before = tokenizer.decode(ids[start:i]) if i > start else ""
        full = tokenizer.decode(ids[start : i + 1])
        if full.endswith("\ufffd"):
            out.append("")  # an incomplete character: the token that completes it shows it
            continue
        # Strip the partial characters the window's start (or the previous token) left behind.
        while before.endswith("\ufffd"):
            before = before[:-1]
        out.append(full[len(before):] if full.startswith(before) else tokenizer.decode([ids[i]]))
    return out
