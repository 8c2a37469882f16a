"""Messages to prompt token ids with the model's own chat template, and streamed text."""

from __future__ import annotations

import json
import logging
import re
import weakref
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from engine.constraint import template_messages
from engine.errors import RequestError
from engine.types import Message, TemplateOptions

Tools = Optional[Sequence[dict[str, Any]]]  # OpenAI tool definitions, handed to the template as is


class _OnlyCounting(logging.Filter):
    """transformers warns when a text encodes to more tokens than the tokenizer's
    `model_max_length` ("... Running this sequence through the model will result in indexing
    errors"). Here encoding is counting: every prompt is fitted to the context (refused, or its
    oldest turns left out: engine/generate/context.py) before any forward, so no such sequence
    is ever run, and the warning (printed at the window's start, counting a long conversation
    for the context meter) would only mislead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Token indices sequence length is longer than the specified maximum")


logging.getLogger("transformers.tokenization_utils_base").addFilter(_OnlyCounting())


@dataclass(frozen=True)
class Rendered:
    """A conversation rendered once: its token ids, and the text the chat template wrote (None
    for a tokenizer without a template). Where a document lies is found in the text."""

    ids: list[int]
    text: Optional[str]


def render(tokenizer: Any, messages: Sequence[Message], add_generation_prompt: bool = True,
           tools: Tools = None, options: TemplateOptions = ()) -> Rendered:
    """The conversation through the model's chat template, by default with the generation prompt
    added (ready for a reply): the template is applied once, to text, and the text encoded as
    transformers' `apply_chat_template(tokenize=True)` encodes it (no special tokens added: the
    template writes its own). `tools` go to the template as transformers passes them (`tools=`),
    tool-call arguments as objects (engine/constraint.py: template_messages); `options` (the
    request's template_options) as keyword arguments, as transformers passes its extra kwargs."""
    text: Optional[str] = None
    if getattr(tokenizer, "chat_template", None):
        text = _apply_template(tokenizer, messages, add_generation_prompt, tools, options)
        if not isinstance(text, str):
            raise RequestError("the model's chat template rendered no text")
        _check_names(tokenizer, messages)
        ids = None
        if typed_markers(tokenizer, messages):  # a control token's text typed in a message
            ids = encode_contents_as_text(tokenizer, messages, add_generation_prompt, tools, text, options)
        if ids is None:
            ids = list(tokenizer.encode(text, add_special_tokens=False))
    else:  # base models without a template: plain text, one turn per line
        plain = "\n".join(f"{m['role']}: {m['content']}" for m in messages)
        if add_generation_prompt:
            plain += "\nassistant:"
        ids = list(tokenizer.encode(plain))
    if not ids:
        raise RequestError("the conversation rendered to an empty prompt")
    return Rendered([int(t) for t in ids], text)


def render_prompt(tokenizer: Any, messages: Sequence[Message], add_generation_prompt: bool = True,
                  tools: Tools = None, options: TemplateOptions = ()) -> list[int]:
    """Token ids of the conversation (`render`'s ids)."""
    return render(tokenizer, messages, add_generation_prompt, tools, options).ids


def _apply_template(tokenizer: Any, messages: Sequence[Message], add_generation_prompt: bool, tools: Tools,
                    options: TemplateOptions = ()) -> Any:
    """The chat template's text for `messages`, applied as transformers applies it."""
    extra: dict[str, Any] = dict(options)
    if tools:
        extra["tools"] = list(tools)
    try:
        return tokenizer.apply_chat_template(template_messages(messages), add_generation_prompt=add_generation_prompt,
                                             tokenize=False, **extra)
    except Exception as e:  # jinja errors: e.g. a template that rejects a system message
        raise RequestError(f"the model's chat template rejected the conversation: {e}") from e


# -- special tokens typed in content are text (issue 36)
#
# The tokenizer finds its control tokens (<|im_start|>, <end_of_turn>, <tool_call>, ...) anywhere in
# the rendered text, so a marker a user, a tool result or a web page wrote would become a real
# control token and could forge a turn. A conversation whose contents hold no control token's text
# is encoded exactly as before (the template's own ids: nothing cached changes). One that does is
# rendered a second time with a placeholder for each content, which tells the template's own text
# (its markers stay control tokens) from the contents (encoded as plain text, no added tokens).


@dataclass
class _Markers:
    """A tokenizer's control tokens as the text that names them, for leftmost-longest search (as
    the tokenizers library's added vocabulary matches them), and a copy of its backend that
    knows none of them (it encodes a marker's text as ordinary text)."""

    ids: dict[str, int]  # control token text -> id
    lengths: dict[str, list[int]]  # first character -> the lengths of the tokens it starts, longest first
    first: re.Pattern[str]  # any first character
    plain: Any  # tokenizers.Tokenizer without the control tokens (other added tokens kept)

    def find(self, text: str, start: int = 0) -> Optional[tuple[int, str]]:
        """The leftmost, then longest, added token in text[start:]: (position, token text)."""
        while (m := self.first.search(text, start)) is not None:
            i = m.start()
            for n in self.lengths[text[i]]:
                if text[i:i + n] in self.ids:
                    return i, text[i:i + n]
            start = i + 1
        return None


_MARKERS: "weakref.WeakKeyDictionary[Any, Optional[_Markers]]" = weakref.WeakKeyDictionary()


def _markers(tokenizer: Any) -> Optional[_Markers]:
    """The added-token search for `tokenizer` (None: not a tokenizers-library tokenizer, or one
    without added tokens; its content is encoded as the template renders it)."""
    try:
        return _MARKERS[tokenizer]
    except (KeyError, TypeError):
        pass
    found = _build_markers(tokenizer)
    try:
        _MARKERS[tokenizer] = found
    except TypeError:  # not weak-referenceable: built again next time
        pass
    return found


def _build_markers(tokenizer: Any) -> Optional[_Markers]:
    """The control tokens: the special added tokens, and the added tokens the chat template
    writes itself (e.g. a Qwen template's <tool_call>, added but not special). Other added tokens
    (Gemma's whitespace runs and HTML tags) are ordinary text pieces and stay as they are."""
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    backend = getattr(inner, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "get_added_tokens_decoder"):
        return None
    template = getattr(inner, "chat_template", None) or getattr(tokenizer, "chat_template", None)
    source = template if isinstance(template, str) else json.dumps(template)
    ids = {t.content: int(i) for i, t in backend.get_added_tokens_decoder().items()
           if t.content and (t.special or (t.content in source and not any(c.isspace() for c in t.content)))}
    if not ids:
        return None
    from tokenizers import Tokenizer

    spec = json.loads(backend.to_str())
    spec["added_tokens"] = [t for t in spec.get("added_tokens", []) if t.get("content") not in ids]
    plain = Tokenizer.from_str(json.dumps(spec))
    lengths: dict[str, set[int]] = {}
    for text in ids:
        lengths.setdefault(text[0], set()).add(len(text))
    first = re.compile("[" + "".join(re.escape(c) for c in lengths) + "]")
    return _Markers(ids, {c: sorted(n, reverse=True) for c, n in lengths.items()}, first, plain)


def typed_markers(tokenizer: Any, messages: Sequence[Message]) -> bool:
    """Whether any message's content holds the text of one of the tokenizer's control tokens."""
    markers = _markers(tokenizer)
    return markers is not None and any(
        isinstance(m.get("content"), str) and markers.find(m["content"]) is not None for m in messages)


def _check_names(tokenizer: Any, messages: Sequence[Message]) -> None:
    """A message's `name` is written into the prompt by templates that show names, where a
    control token's text would become the token (contents are encoded as text; a name is too
    short to need that): such a name is refused."""
    markers = _markers(tokenizer)
    if markers is None:
        return
    for i, m in enumerate(messages):
        name = m.get("name")
        if isinstance(name, str) and (hit := markers.find(name)) is not None:
            raise RequestError(f"messages[{i}].name holds the model's control token {hit[1]!r}", f"messages[{i}].name")


def _placeholder(i: int) -> str:
    return f"\ue000{i}\ue001"  # private-use characters: no template or tokenizer treats them


_PLACEHOLDER = re.compile("\ue000([0-9]+)\ue001")


def encode_contents_as_text(tokenizer: Any, messages: Sequence[Message], add_generation_prompt: bool = True,
                            tools: Tools = None, text: Optional[str] = None,
                            options: TemplateOptions = ()) -> Optional[list[int]]:
    """Token ids of the conversation with the template's markers as control tokens and every
    message content as plain text (a control token's text in it is encoded as text).

    The template renders the conversation twice: as it is, and with a placeholder for each
    content. The placeholders split the second into the template's own text; each content is
    found in the first between them (as is, or trimmed, as templates such as Gemma's trim it).
    The template's text is searched for control tokens; the text between two of them (template
    text and contents together) is encoded with the tokenizer's backend without them, as the
    tokenizer encodes the text between its control tokens. None when the template does
    more to a content than trim it (the caller keeps the template's own encoding). `text`: the
    conversation as the template writes it, when the caller has it already."""
    markers = _markers(tokenizer)
    if markers is None:
        return None
    if text is None:
        text = _apply_template(tokenizer, messages, add_generation_prompt, tools, options)
    held = [{**m, "content": _placeholder(i)} if isinstance(m.get("content"), str) else m
            for i, m in enumerate(messages)]
    skeleton = _apply_template(tokenizer, held, add_generation_prompt, tools, options)
    if not isinstance(text, str) or not isinstance(skeleton, str):
        return None
    parts = _PLACEHOLDER.split(skeleton)  # template text, message index, template text, ...
    pieces: list[tuple[bool, str]] = []  # (is content, text), in order
    pos = 0
    for k, part in enumerate(parts):
        if k % 2 == 0:  # the template's own text: it must come next in the rendered text
            if not text.startswith(part, pos):
                return None
            pieces.append((False, part))
            pos += len(part)
            continue
        content, after = messages[int(part)]["content"], parts[k + 1]
        for form in dict.fromkeys((content, content.strip(), content.lstrip(), content.rstrip())):
            if text.startswith(form, pos) and text.startswith(after, pos + len(form)):
                pieces.append((True, form))
                pos += len(form)
                break
        else:
            return None
    if pos != len(text):
        return None
    ids: list[int] = []
    run = ""  # text since the last control token

    def flush() -> None:
        nonlocal run
        if run:
            ids.extend(markers.plain.encode(run, add_special_tokens=False).ids)
            run = ""

    for is_content, piece in pieces:
        start = 0
        while not is_content and (hit := markers.find(piece, start)) is not None:
            at, marker = hit
            run += piece[start:at]
            flush()
            ids.append(markers.ids[marker])
            start = at + len(marker)
        run += piece[start:]
    flush()
    return ids


def encode_prefix(tokenizer: Any, text: str, content_at: int) -> list[int]:
    """Token ids of `text`, a prefix of a rendered prompt whose characters from `content_at` on
    are a message's content, as the prompt encodes it: the template's control tokens before
    `content_at`, the content as text (a control token's text in it stays text, as
    encode_contents_as_text encodes it). Where a document ends in the prompt (placement.py)."""
    markers = _markers(tokenizer)
    if markers is None or markers.find(text, content_at) is None:  # the prompt was encoded whole
        return [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]
    ids: list[int] = []
    start = 0
    template = text[:content_at]
    while (hit := markers.find(template, start)) is not None:
        at, marker = hit
        if at > start:
            ids.extend(markers.plain.encode(template[start:at], add_special_tokens=False).ids)
        ids.append(markers.ids[marker])
        start = at + len(marker)
    ids.extend(markers.plain.encode(text[start:], add_special_tokens=False).ids)
    return ids


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

    def __call__(self, messages: Sequence[Message], prompt: Sequence[int], tools: Tools = None,
                 options: TemplateOptions = ()) -> list[int]:
        out: list[int] = []
        for i in range(1, len(messages) + 1):
            ids = self.rendered(messages[:i], tools, generation=False, options=options)
            if ids is not None and _is_prefix(ids, prompt):
                out.append(len(ids))
        return out

    def end_of(self, messages: Sequence[Message], prompt: Sequence[int], tools: Tools = None,
               options: TemplateOptions = ()) -> Optional[int]:
        """Where `messages` (a prefix of the conversation) end in `prompt`, when they rendered
        alone are a proper prefix of it (None otherwise, or for no messages)."""
        if not messages:
            return None
        ids = self.rendered(messages, tools, generation=False, options=options)
        return len(ids) if ids is not None and _is_prefix(ids, prompt) else None

    def reply_header_cuts(self, messages: Sequence[Message], prompt: Sequence[int], tools: Tools = None,
                          options: TemplateOptions = ()) -> list[int]:
        """G_i - 1 for each assistant message i of `messages` whose turn's prompt (G_i tokens:
        the messages before it with the generation prompt) is a prefix of `prompt`."""
        out: list[int] = []
        for i, m in enumerate(messages):
            if i == 0 or m.get("role") != "assistant":
                continue
            ids = self.rendered(messages[:i], tools, generation=True, options=options)
            if ids is not None and len(ids) > 1 and _is_prefix(ids, prompt):
                out.append(len(ids) - 1)
        return out

    def rendered(self, messages: Sequence[Message], tools: Tools, generation: bool,
                 options: TemplateOptions = ()) -> Optional[list[int]]:
        """The tokens of `messages` (memoized; None: the template will not render them alone)."""
        # Keyed by every key of every message (tool calls too), the tools the template shows, the
        # template options and whether the generation prompt is added.
        key = ("gen" if generation else "", json.dumps(list(tools or ()), sort_keys=True), json.dumps(options),
               *(json.dumps(m, sort_keys=True, ensure_ascii=False) for m in messages))
        if key not in self._memo:
            if len(self._memo) >= self._max:
                self._memo.pop(next(iter(self._memo)))
            try:
                self._memo[key] = render_prompt(self._tok, messages, add_generation_prompt=generation, tools=tools,
                                                options=options)
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


# -- control tokens a reply samples are never text (issue 47)


@dataclass(frozen=True)
class ControlTokens:
    """What a reply's control tokens (the tokenizer's special tokens) do when the model samples
    one: none is ever text. Its id and logprob stay in the reply like any token's.

    `ends`: the reply ends there, as at an end token (finish "stop"): the end tokens, the
    tokenizer's own end, padding and start-of-text tokens (`<|endoftext|>` used as padding), and
    the token the template opens a turn with when its turns close with an end token (ChatML's
    `<|im_start|>`: a model that opens the next turn is past its own). `hidden`: every other
    special token, left out of the text while decoding goes on (a template whose messages end
    without ending the turn, as gpt-oss's `<|end|>`, opens further messages within one reply).
    The reply's own markup stays text whatever the tokenizer calls it: the tool-call and thinking
    markers mlx-lm reads (the server parses calls out of the text)."""

    ends: frozenset[int] = frozenset()
    hidden: frozenset[int] = frozenset()


def control_tokens(tokenizer: Any, eos_ids: set[int]) -> ControlTokens:
    """The control tokens of `tokenizer` (see ControlTokens); its end tokens `eos_ids` end a reply
    in any case. A tokenizer that is not a tokenizers-library one: only its end tokens."""
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    backend = getattr(inner, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "get_added_tokens_decoder"):
        return ControlTokens(frozenset(eos_ids))
    special = {int(i): t.content for i, t in backend.get_added_tokens_decoder().items() if t.special}
    markup: set[int] = set()
    for name in ("tool_call_start", "tool_call_end", "think_start", "think_end"):
        text = getattr(tokenizer, name, None)
        if isinstance(text, str) and text:
            markup.update(int(t) for t in tokenizer.encode(text, add_special_tokens=False))
    ends = set(eos_ids)
    for name in ("eos_token", "pad_token", "bos_token"):
        text = getattr(inner, name, None)
        ends.update(i for i, t in special.items() if isinstance(text, str) and t == text)
    opener = _turn_opener(tokenizer, special.keys() - markup, eos_ids)
    if opener is not None:
        ends.add(opener)
    ends -= markup
    return ControlTokens(frozenset(ends), frozenset(special.keys() - ends - markup))


def _turn_opener(tokenizer: Any, special: set[int], eos_ids: set[int]) -> Optional[int]:
    """The control token the chat template opens the reply's turn with, when the turn before it
    closed with an end token (a user message rendered alone, then with the generation prompt: the
    first control token the prompt adds, and the last one before it); None otherwise."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    user = [{"role": "user", "content": "?"}]
    try:
        before = render_prompt(tokenizer, user, add_generation_prompt=False)
        after = render_prompt(tokenizer, user, add_generation_prompt=True)
    except RequestError:
        return None
    if after[: len(before)] != before:
        return None
    opener = next((t for t in after[len(before):] if t in special), None)
    closer = next((t for t in reversed(before) if t in special), None)
    return opener if opener is not None and closer in eos_ids else None


class TextStream:
    """Turns a growing token list into text deltas that never split a multi-byte character.

    Decodes the whole reply each step (fast tokenizers decode thousands of tokens in well under
    a decode step) so the deltas always concatenate to exactly `tokenizer.decode(tokens)`,
    whatever the tokenizer does with spaces at segment starts. The tokens in `skip` (the
    control tokens: ControlTokens) are no text: left out of the decoded ids.
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
