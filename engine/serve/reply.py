"""A reply as events, read while it is decoded: text deltas and tool calls (issue 47).

Every wire format (engine/serve/formats/) renders the same events: `TextDelta`, and for each tool
call `CallStart` (its id and name), `CallArguments` fragments, `CallEnd` (the whole arguments).
`ReplyReader.feed` takes the reply's text as the engine decodes it; `finish` ends it and returns
the whole `Reply` (content, calls, the engine's finish reason). The reader decides only on the
text so far, so a reply read whole (a non-streamed answer) gives the same events, in the same
order, as the same reply read token by token: a streamed reply and a non-streamed one agree.

Tool calls are read with the model's own mlx-lm parser (mlx_lm/tool_parsers; mlx_lm.tokenizer_utils
infers the format from the chat template and the engine reports it as `ModelInfo.tool_parser`):

- mlx-lm's `json_tools` format (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`: Qwen,
  Hermes and most tool templates), incrementally: `CallStart` once the name is decoded (and is a
  tool offered), then the arguments object as it is decoded, each fragment extending the ones
  before; together they are exactly the final arguments (the model's own JSON text), so every
  prefix a client assembles is a prefix of them;
- any other format: the whole call at once, when its end marker is decoded.

Content is the text outside the calls; whitespace next to a call is not content. A call's markup
never shows as content. A call whose name is not a tool offered, or one in another format that
does not parse, stays content (nothing is lost). Once a call has started it is a call: cut by
max_tokens (or the context), or ended by the model inside it, it comes back with its arguments as
far as they came (OpenAI's finish_reason "length" for a cut one); a call cut before its name was
whole is dropped.

Call ids are derived from the request (`key`), the reply's text before the call and the call's
index: the same request gives the same reply and the same ids, so an agent loop sent twice stays
byte-identical and its next step's prompt (which quotes the ids) hits the prompt cache.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Union

from engine.constraint import Constraint


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str  # a hex digest; each wire format adds its own prefix ("call_", "toolu_")
    name: str


@dataclass(frozen=True)
class CallArguments:
    index: int
    fragment: str


@dataclass(frozen=True)
class CallEnd:
    index: int
    arguments: str  # the whole arguments: every CallArguments fragment of the call, joined


ReplyEvent = Union[TextDelta, CallStart, CallArguments, CallEnd]


@dataclass
class Call:
    id: str
    name: str
    arguments: str  # JSON text (a JSON prefix when the call was cut)


@dataclass
class Reply:
    """A finished reply: its content (None when it is only calls), its calls and the engine's
    finish reason ("stop", "length", "context", "cancelled")."""

    content: Optional[str]
    calls: list[Call] = field(default_factory=list)
    finish: str = "stop"

    @property
    def cut(self) -> bool:
        return self.finish in ("length", "context")

    @property
    def ended_with_calls(self) -> bool:
        """The model ended its reply after making calls (OpenAI's "tool_calls", Anthropic's "tool_use")."""
        return bool(self.calls) and self.finish == "stop"


# The start of a json_tools call, up to its arguments: {"name": "<name>", "arguments": <value>
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([A-Za-z0-9_.\-]{1,64})"\s*,\s*"arguments"\s*:\s*')
_DECODER = json.JSONDecoder()


def _partial_marker(text: str, marker: str) -> int:
    """How many characters at the end of `text` could be the start of `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


@dataclass
class _OpenCall:
    at: int  # where its start marker begins in the text
    body: int  # where its body begins (after the start marker)
    held: str  # whitespace before it: content again if the call turns out to be text
    index: Optional[int] = None  # set once started (CallStart sent)
    rejected: bool = False  # its name is not a tool offered: it will be content
    args_at: Optional[int] = None  # where its arguments value begins (json_tools)
    args_end: Optional[int] = None  # where that value ended (once whole)
    sent: str = ""  # the arguments sent so far


class ReplyReader:
    """Reads one reply's text into events as it grows (see the module's docstring)."""

    def __init__(self, parser: Optional[str], constraint: Optional[Constraint], key: str = "") -> None:
        self._key = key
        self._tools: list[dict[str, Any]] = []
        self._names: set[str] = set()
        self.start = self.end = ""
        self._parse: Optional[Callable[[str, Any], Any]] = None
        self._incremental = False
        if parser and constraint is not None and constraint.calls_parsed:
            module = importlib.import_module(f"mlx_lm.tool_parsers.{parser}")
            self.start, self.end = module.tool_call_start, module.tool_call_end
            self._parse = module.parse_tool_call
            self._incremental = parser == "json_tools"
            self._tools = [dict(t) for t in constraint.tools]
            self._names = set(constraint.tool_names())
        self.text = ""  # everything fed
        self._pos = 0  # text before it is decided
        self._ws = ""  # trailing whitespace of the content, held until text follows it
        self._after_call = False  # whitespace right after a call is not content
        self._call: Optional[_OpenCall] = None
        self._content: list[str] = []
        self.calls: list[Call] = []
        self._dropped = False  # a call cut before its name: dropped

    @property
    def reads_calls(self) -> bool:
        return self._parse is not None

    def feed(self, text: str) -> list[ReplyEvent]:
        """The events the reply's next decoded text settles."""
        self.text += text
        out: list[ReplyEvent] = []
        self._advance(out, final=False)
        return out

    def finish(self, text: str, finish: str) -> tuple[list[ReplyEvent], Reply]:
        """The last events and the whole reply, given its final text and the engine's finish
        reason. The final text normally extends what was fed (the engine held back a possible
        stop string's start); if it does not, what was fed stands."""
        out: list[ReplyEvent] = []
        if text.startswith(self.text):
            self.text = text
        self._advance(out, final=True)
        if self._call is not None:
            self._end_open_call(out, cut=finish in ("length", "context"))
        if self._ws and not self.calls:
            self._emit_text(out, self._ws)
        self._ws = ""
        content = "".join(self._content)
        if not content and (self.calls or self._dropped):
            reply_content: Optional[str] = None
        else:
            reply_content = content
        return out, Reply(reply_content, list(self.calls), finish)

    def read(self, text: str, finish: str) -> Reply:
        """A whole reply at once (the same as feeding it in pieces)."""
        self.feed(text)
        return self.finish(text, finish)[1]

    # -- text outside calls -------------------------------------------------------------------
    def _advance(self, out: list[ReplyEvent], final: bool) -> None:
        while True:
            if self._parse is None:  # no tools: the text is the content, as it comes
                self._emit_text(out, self.text[self._pos:])
                self._pos = len(self.text)
                return
            if self._call is None:
                at = self.text.find(self.start, self._pos)
                if at < 0:
                    upto = len(self.text) if final else len(self.text) - _partial_marker(self.text[self._pos:], self.start)
                    self._text(out, self.text[self._pos:upto])
                    self._pos = upto
                    return
                self._text(out, self.text[self._pos:at])
                self._call = _OpenCall(at, at + len(self.start), self._ws)
                self._ws = ""
                self._pos = self._call.body
            if not self._read_call(out, final):
                return

    def _text(self, out: list[ReplyEvent], piece: str) -> None:
        """Content between calls: whitespace next to a call is held back (dropped if a call follows)."""
        if self._after_call:
            piece = piece.lstrip()
            if not piece:
                return
            self._after_call = False
        s = self._ws + piece
        body = s.rstrip()
        self._ws = s[len(body):]
        if body:
            self._emit_text(out, body)

    def _emit_text(self, out: list[ReplyEvent], text: str) -> None:
        if text:
            self._content.append(text)
            out.append(TextDelta(text))

    # -- calls --------------------------------------------------------------------------------
    def _read_call(self, out: list[ReplyEvent], final: bool) -> bool:
        """Go on reading the open call; True once it ended (its end marker was decoded)."""
        c = self._call
        assert c is not None
        end_at = self.text.find(self.end, c.body) if self.end else -1
        limit = end_at if end_at >= 0 else (len(self.text) if final else
                                            len(self.text) - _partial_marker(self.text[c.body:], self.end))
        if self._incremental and c.index is None and not c.rejected and c.args_at is None:
            m = _HEAD.match(self.text, c.body, limit)
            if m is not None:
                if m.group(1) in self._names:
                    self._start(out, c, m.group(1))
                    c.args_at = m.end()
                else:
                    c.rejected = True
        if c.index is not None and c.args_at is not None and c.args_end is None:
            self._stream_arguments(out, c, limit)
        if end_at < 0:
            return False
        self._close(out, c, self.text[c.body:end_at])
        self._pos = end_at + len(self.end)
        self._call = None
        return True

    def _start(self, out: list[ReplyEvent], c: _OpenCall, name: str) -> None:
        c.index = len(self.calls)
        ident = call_id(self._key, self.text[:c.at], c.index)
        self.calls.append(Call(ident, name, ""))
        out.append(CallStart(c.index, ident, name))

    def _stream_arguments(self, out: list[ReplyEvent], c: _OpenCall, limit: int) -> None:
        """The arguments object as far as it is decoded (json_tools): up to its closing brace."""
        assert c.args_at is not None and c.index is not None
        value = self.text[c.args_at:limit]
        if not c.sent:  # the value begins after any whitespace (which may come in its own token)
            c.args_at += len(value) - len(value.lstrip())
            value = value.lstrip()
        if not value.startswith("{"):
            return  # not an object (yet): sent whole when the call ends
        if "}" in value[len(c.sent):]:  # only a closing brace can make the object whole
            try:
                _, n = _DECODER.raw_decode(value)
                value, c.args_end = value[:n], c.args_at + n
            except ValueError:
                pass  # not whole yet: all of it belongs to the object
        if len(value) > len(c.sent):
            out.append(CallArguments(c.index, value[len(c.sent):]))
            c.sent = value

    def _close(self, out: list[ReplyEvent], c: _OpenCall, body: str) -> None:
        """The call's end marker was decoded: the call ends, or (not a call) its text is content."""
        if c.index is not None:
            parsed = self._calls(body)
            whole = parsed[0][1] if parsed and len(parsed) == 1 and not c.sent else None
            self._end(out, c, whole)
            return
        parsed = None if c.rejected else self._calls(body)
        if parsed is None:  # not a call: its text (and the whitespace before it) is content
            self._ws = c.held
            self._text(out, self.text[c.at:c.body] + body + self.end)
            return
        for name, arguments in parsed:
            self._start(out, c, name)
            self._end(out, c, arguments)

    def _end(self, out: list[ReplyEvent], c: _OpenCall, whole: Optional[str]) -> None:
        assert c.index is not None
        if whole is not None and whole.startswith(c.sent) and len(whole) > len(c.sent):
            out.append(CallArguments(c.index, whole[len(c.sent):]))
            c.sent = whole
        self.calls[c.index].arguments = c.sent
        out.append(CallEnd(c.index, c.sent))
        self._after_call = True

    def _end_open_call(self, out: list[ReplyEvent], cut: bool) -> None:
        """The reply ended inside a call (cut, or the model stopped in it)."""
        c = self._call
        assert c is not None
        self._call = None
        body = self.text[c.body:]
        if c.index is not None:
            self._end(out, c, None if c.sent else (self._calls(body) or [("", None)])[0][1])
            return
        parsed = None if c.rejected else self._calls(body)
        if parsed is not None:  # only the end marker was cut
            for name, arguments in parsed:
                self._start(out, c, name)
                self._end(out, c, arguments)
        elif cut:
            self._dropped = True  # cut before its name was whole: no call, and never its markup as content
        else:
            self._ws = c.held
            self._text(out, self.text[c.at:])

    def _calls(self, body: str) -> Optional[list[tuple[str, str]]]:
        """(name, arguments) of each call in a call's body, by the model's parser; None if it does
        not parse or names a tool not offered."""
        assert self._parse is not None
        try:
            parsed = self._parse(body, self._tools)
        except Exception:  # the parsers raise what their format's reader raises (json, ast, regex)
            return None
        out = []
        for tc in parsed if isinstance(parsed, list) else [parsed]:
            if not isinstance(tc, dict) or tc.get("name") not in self._names:
                return None
            args = tc.get("arguments", {})
            out.append((tc["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)))
        return out or None


def call_id(key: str, before: str, index: int) -> str:
    """A call's id (hex): from the request, the reply's text before the call and its index."""
    return hashlib.sha256(json.dumps([key, before, index]).encode()).hexdigest()[:24]


def request_key(request: Any) -> str:
    """What a call id is derived from besides the reply: the request as the engine got it (its
    messages, tools, sampler and seed), less what only decides how the cache is used (its
    namespace, whether it is used, the mode): a cold run of a request gives a regenerate's ids."""
    return hashlib.sha256(repr(replace(request, cache_namespace=None, use_cache=True, mode="exact")).encode()).hexdigest()
