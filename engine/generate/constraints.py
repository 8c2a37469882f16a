"""Grammar-constrained decoding: a `Constraint` (engine/constraint.py) as a token mask, with llguidance.

Why llguidance (measured on the demo model: docs/benchmarks.md, bench/constrained_decode.py):
its mask for a 49k vocabulary costs ~0.2 ms a token (0.05% of a demo decode step), grammars compile in
milliseconds (a JSON Schema or a Lark grammar with `%json` inside, which is what a tool call
in a chat template's own markup needs), it has no runtime dependencies, and its bitmask is a
plain int32 numpy array we turn into a boolean MLX array. xgrammar 0.2.8 imports torch (and
declares torch and triton) just to load; outlines-core 0.2.14 compiles a regex over the whole
vocabulary up front (seconds per schema) and has no grammar for the markup around a call.
Both libraries' own MLX helpers are Metal kernels; the mask here is one `mx.where`, so it runs
on every backend.

The mask is applied to the logits before anything else in the sampler (engine/generate/sampling.py),
for every sampler setting: greedy, temperature, top-k/p, min-p, repetition penalty and
logit_bias all pick among allowed tokens only. It depends only on the tokens so far, so a
constrained reply is as deterministic as any other.

The grammar (issue 36, OpenAI's semantics): a Lark grammar whose `start` is tool calls in the
model's own markup (a named function: exactly one; "required"/"auto": up to MAX_PARALLEL_CALLS,
one when parallel_tool_calls is false), content in the response format, or, under "auto" with a
format, either. Each tool's parameters and the format's schema are a `%json` rule of their own,
so their `$ref`s resolve against the schema the user wrote, not against anything around it.
Before any prefill, schemas that must contain themselves, grammars llguidance refuses and ones
that reach its limits on a short probe get a 400 naming the field (`tools[i]`, `response_format`);
what still fails while decoding raises `ConstraintFailed` (a 400 the clients do not retry).

Whitespace is bounded: JSON comes out with fixed separators (", " and ": ", the style chat
templates render tool calls in) and no other whitespace, so a weak model cannot spend its
tokens on newlines.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from typing import Any, Optional, Sequence

import numpy as np

from engine.constraint import Constraint
from engine.errors import RequestError

# JSON layout inside every grammar: no free whitespace, separators as templates write them.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_PARALLEL_CALLS = 8  # tool calls one forced reply may make
_COMPILED_KEPT = 64  # grammars remembered per model (an agent sends the same tools every step)
_COMPILED_BYTES = 16 << 20  # and at most this many bytes of them (a schema may take up to 1 MiB)
_PROBE_STEPS = 24  # tokens each probe path walks before any prefill (Grammars._probe)


def tool_format(tokenizer: Any) -> Optional[str]:
    """The mlx-lm tool parser a model's template implies (mlx_lm.tokenizer_utils infers it from
    the chat template: `<tool_call>` with `tool_call.name` gives "json_tools"), or None when the
    model has no tool calling."""
    if not getattr(tokenizer, "has_tool_calling", False):
        return None
    parser = getattr(tokenizer, "tool_parser", None)
    module = getattr(parser, "__module__", "") or ""
    return module.rsplit(".", 1)[-1] or None


def _hf_tokenizer(tokenizer: Any) -> Any:
    return getattr(tokenizer, "_tokenizer", tokenizer)


class ConstraintFailed(RequestError):
    """A grammar that compiled but failed while decoding (a limit of llguidance reached on the
    way): the reply ends with this short error (a 400 the clients do not retry), the engine goes on."""


# llguidance's limit errors in plain words (what a schema's author can change)
_PLAIN = (("row has", "too many alternatives at one point (such as hundreds of optional properties)"),
          ("too many items", "too many alternatives at one point (such as hundreds of optional properties)"),
          ("too many expressions", "a pattern or repeat too large to match (such as x{1000}{1000})"),
          ("lexer", "a pattern or repeat too large to match"),
          ("noextension", "the schema admits no value"))


def _reason(error: str) -> str:
    """llguidance's error in a few plain words where it is a known limit, else its first line
    (never the parser state or the grammar), cut short."""
    lines = error.replace("<non-verbose/>", "").strip().splitlines()
    first = lines[0] if lines else "unknown error"
    plain = next((words for key, words in _PLAIN if key in first.lower()), None)
    return plain or clip_text(first, 90)


def clip_text(text: str, limit: int) -> str:
    text = "".join(ch if " " <= ch <= "~" else "?" for ch in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _limits() -> Any:
    from llguidance import LLParserLimits

    # Errors without the parser's state and the grammar in them (what a client reads).
    return LLParserLimits(verbose_errors=False)


def _json_rule(schema: dict[str, Any], strict: bool) -> str:
    """`%json` of `schema` as the tool or the user wrote it: compiled as its own root, so its
    `$ref`s (`#/$defs/...`, `#/properties/...`, `#`) resolve against it, not against anything
    around it. The layout options ride in `x-guidance`, which llguidance reads and drops."""
    return "%json " + json.dumps({**schema, "x-guidance": {**JSON_OPTIONS, "lenient": not strict}})


def no_finite_value(root: Any) -> bool:
    """True when every value of `root` must contain another value of itself: `{"$ref": "#"}`, an
    a -> b -> a cycle of `$ref`s, a required property (or a non-empty array's items) that refers
    back. No JSON text satisfies such a schema, and llguidance would only find out while decoding.
    A least fixpoint: a node has a finite value when all it must contain has one (and, with
    anyOf/oneOf, one branch has)."""
    if not isinstance(root, dict):
        return False
    nodes: dict[int, dict[str, Any]] = {}
    needs: dict[int, list[int]] = {}
    branches: dict[int, list[int]] = {}

    def resolve(ref: Any) -> Optional[dict[str, Any]]:
        if not isinstance(ref, str) or not ref.startswith("#"):
            return None
        node: Any = root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict):
                node = node.get(part)
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return None
        return node if isinstance(node, dict) else None

    todo = [root]
    while todo:
        node = todo.pop()
        if id(node) in nodes:
            continue
        nodes[id(node)] = node
        must: list[dict[str, Any]] = []
        target = resolve(node.get("$ref"))
        if target is not None:
            must.append(target)
        must += [s for s in node.get("allOf") or () if isinstance(s, dict)]
        props = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        required = node.get("required") if isinstance(node.get("required"), list) else []
        must += [props[r] for r in required if isinstance(r, str) and isinstance(props.get(r), dict)]
        min_items = node.get("minItems", 0)
        if isinstance(min_items, int) and min_items >= 1:
            prefix = [s for s in node.get("prefixItems") or () if isinstance(s, dict)]
            must += prefix[:min_items]
            if min_items > len(prefix) and isinstance(node.get("items"), dict):
                must.append(node["items"])
        alts = [s for key in ("anyOf", "oneOf") for s in node.get(key) or () if isinstance(s, dict)]
        needs[id(node)] = [id(s) for s in must]
        branches[id(node)] = [id(s) for s in alts]
        todo += must + alts
    finite: set[int] = set()
    changed = True
    while changed:
        changed = False
        for k in nodes:
            if k not in finite and all(n in finite for n in needs[k]) and (
                    not branches[k] or any(b in finite for b in branches[k])):
                finite.add(k)
                changed = True
    return id(root) not in finite


class Grammars:
    """One per loaded model: the llguidance view of its tokenizer (built on first use) and the
    grammars of the constraints it was asked for, per cache namespace (an API key's: another
    key's identical schema is compiled again, so its timing tells nothing of what others sent),
    kept within a byte budget."""

    def __init__(self, tokenizer: Any, width: int, eos_ids: set[int]) -> None:
        self._tok = tokenizer
        self.width = width  # the logits' width (may exceed the tokenizer's vocabulary)
        self._eos = sorted(eos_ids)
        self._ll: Any = None
        self._compiled: "OrderedDict[str, str]" = OrderedDict()  # digest(namespace, constraint) -> grammar
        self._bytes = 0
        self.compiles = 0  # grammars built (a cache miss each): what the namespace tests count

    def _lltokenizer(self) -> Any:
        if self._ll is None:
            import llguidance.hf

            try:
                self._ll = llguidance.hf.from_tokenizer(_hf_tokenizer(self._tok), n_vocab=self.width,
                                                        eos_token=self._eos or None)
            except Exception as e:  # a tokenizer llguidance cannot read (not a fast tokenizer)
                raise RequestError(f"constrained decoding is not available for this model's tokenizer: {e}",
                                   "response_format") from e
        return self._ll

    @staticmethod
    def cache_key(constraint: Constraint, namespace: Optional[str]) -> str:
        return hashlib.sha256(json.dumps([namespace, constraint.identity()]).encode()).hexdigest()

    def grammar(self, constraint: Optional[Constraint], namespace: Optional[str] = None) -> Optional[str]:
        """The checked grammar of `constraint` (None when it does not constrain decoding);
        RequestError naming the field (`tools[i]`, `response_format`) when it cannot be compiled,
        admits no value, or reaches one of llguidance's limits on a short probe, all before any
        prefill."""
        if constraint is None or not constraint.decoding:
            return None
        key = self.cache_key(constraint, namespace)
        if key in self._compiled:
            self._compiled.move_to_end(key)
            return self._compiled[key]
        grammar = self._build(constraint)
        self.compiles += 1
        self._compiled[key] = grammar
        self._bytes += len(grammar)
        while len(self._compiled) > 1 and (len(self._compiled) > _COMPILED_KEPT or self._bytes > _COMPILED_BYTES):
            self._bytes -= len(self._compiled.popitem(last=False)[1])
        return grammar

    def _build(self, c: Constraint) -> str:
        calls = c.forced_tool or (c.calls_parsed and c.response_format is not None)
        alts: list[str] = []
        rules: list[str] = []
        parts: list[tuple[str, str]] = []  # (grammar of one schema alone, the field it names)
        if calls:
            names = [c.function] if c.tool_choice == "function" else c.tool_names()
            start = self._marker(self._tool_format_checked(c).tool_call_start)
            end = self._marker(self._tok.tool_call_end)
            bodies = []
            for name in names:
                i = c.tool_names().index(name)
                fn = (c.tool(name) or {}).get("function", {})
                params = fn.get("parameters") or {"type": "object"}
                rule = _json_rule(params, bool(fn.get("strict")))
                self._check(f"start: {rule}\n", params, f"tools[{i}]")
                parts.append((f"start: {rule}\n", f"tools[{i}]"))
                rules.append(f"args{i}: {rule}")
                head = json.dumps({"name": name})[:-1] + ', "arguments": '  # {"name": "f", "arguments":
                bodies.append(f'{json.dumps(head)} args{i} "}}"')
            rules.append("body: " + " | ".join(bodies))
            rules.append(f"call: {start} \"\\n\" body \"\\n\" {end}")
            # A named function: exactly one call (OpenAI's forced function). "required"/"auto":
            # parallel calls unless parallel_tool_calls is false, at most MAX_PARALLEL_CALLS.
            many = c.tool_choice != "function" and c.parallel_tool_calls
            alts.append(f'call ("\\n" call){{0,{MAX_PARALLEL_CALLS - 1}}}' if many else "call")
        fmt = c.response_format
        if fmt is not None and not c.forced_tool:  # forced: the reply is the call, the format is for later turns
            schema = fmt["schema"] if fmt["type"] == "json_schema" else {"type": "object"}
            rule = _json_rule(schema, bool(fmt.get("strict")))
            self._check(f"start: {rule}\n", schema, "response_format")
            parts.append((f"start: {rule}\n", "response_format"))
            rules.append(f"content: {rule}")
            alts.append("content")
        grammar = f"start: {' | '.join(alts)}\n" + "\n".join(rules) + "\n"
        self._check(grammar, None, "response_format" if fmt is not None and not c.forced_tool else "tools")
        # The probe walks the whole grammar once; only when it fails are the parts walked alone,
        # to name the one at fault (a probe costs ~60 ms on a 262k vocabulary).
        error = self._probe(grammar)
        if error is not None:
            param = next((p for g, p in parts if self._probe(g) is not None), parts[-1][1] if parts else "tools")
            raise RequestError(f"'{param}' is past the constraint engine's limits: {error}", param)
        return grammar

    def _tool_format_checked(self, c: Constraint) -> Any:
        fmt = tool_format(self._tok)
        if fmt != "json_tools":
            what = (f"'tool_choice' {c.tool_choice!r} is" if c.forced_tool else "tools with a 'response_format' are")
            raise RequestError(f"{what} enforced only for models whose tool calls are JSON (mlx-lm's json_tools "
                               f"format); this model's format is {fmt or 'unknown'}"
                               + (": use 'auto'" if c.response_format is None else ""), "tool_choice")
        return self._tok

    def _check(self, grammar: str, schema: Any, param: str) -> None:
        """Refuse `grammar` (400 naming `param`) if its schema admits no finite value or llguidance
        does not compile it. (The probe, `_probe`, runs on the composed grammar.)"""
        from llguidance import LLMatcher

        if schema is not None and no_finite_value(schema):
            raise RequestError(f"'{param}': the schema admits no finite value (it requires itself through $ref)",
                               param)
        failed, messages = LLMatcher.validate_grammar_with_warnings(grammar, self._lltokenizer(), limits=_limits())
        if failed:
            raise RequestError(f"'{param}' cannot be compiled into a grammar: {_reason(messages[0])}", param)

    def _probe(self, grammar: str) -> Optional[str]:
        """Walk the grammar a few tokens along two paths (always the lowest, always the highest
        allowed token id): llguidance's error on the way (short), or None."""
        from llguidance import LLMatcher
        from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

        m = LLMatcher(self._lltokenizer(), grammar, log_level=0, limits=_limits())
        bits = allocate_token_bitmask(1, self.width)
        eos = np.array(self._eos, dtype=np.int64)
        for pick in (0, -1):
            m.reset()
            for step in range(_PROBE_STEPS):
                fill_next_token_bitmask(m, bits, 0)
                if m.is_error():
                    return _reason(m.get_error())
                allowed = np.flatnonzero(np.unpackbits(bits.view(np.uint8), bitorder="little")[: self.width])
                allowed = allowed[~np.isin(allowed, eos)]  # numpy: a free string allows most of the vocabulary
                if m.is_stopped() or not len(allowed):
                    break
                if not m.consume_token(int(allowed[pick])):
                    return _reason(m.get_error())
        return None

    def _marker(self, text: str) -> str:
        """A tool-call marker in Lark: the one token that spells it when the tokenizer has one
        (llguidance reads added tokens as special: `<[id]>`), else its text as a string."""
        ids = self._tok.encode(text, add_special_tokens=False)
        ll = self._lltokenizer()
        if len(ids) == 1 and ll.is_special_token(int(ids[0])):
            return f"<[{int(ids[0])}]>"
        return json.dumps(text)

    def guide(self, grammar: str, param: str = "response_format") -> "Guide":
        from llguidance import LLMatcher

        matcher = LLMatcher(self._lltokenizer(), grammar, log_level=0, limits=_limits())
        if matcher.is_error():
            raise ConstraintFailed(f"'{param}': the grammar failed to start: {_reason(matcher.get_error())}", param)
        return Guide(matcher, self.width, param)


class Guide:
    """One generation's grammar state: the mask of the next token, and each token fed to it."""

    def __init__(self, matcher: Any, width: int, param: str = "response_format") -> None:
        from llguidance.numpy import allocate_token_bitmask

        self._m = matcher
        self.width = width
        self.param = param  # the request field a failure names
        self._bits = allocate_token_bitmask(1, width)

    def mask(self) -> Any:
        """The allowed next tokens as a boolean MLX array [1, width]."""
        import mlx.core as mx
        from llguidance.numpy import fill_next_token_bitmask

        fill_next_token_bitmask(self._m, self._bits, 0)
        if self._m.is_error():  # a limit reached on the way (the mask would allow only EOS)
            raise self._failed()
        allowed = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self.width].astype(bool)
        return mx.array(allowed)[None, :]

    def consume(self, token: int) -> None:
        """Advance past `token` (one the mask allowed)."""
        if not self._m.consume_token(token):
            raise self._failed()

    def check_reply_so_far(self, tokens: Sequence[int]) -> None:
        """A Continue's reply so far, fed to the grammar before any prefill: a reply that was not
        made under this grammar (another schema, none) may not fit it, and is refused as that."""
        for i, token in enumerate(tokens):
            if not self._m.consume_token(token):
                raise ConstraintFailed(
                    f"continue: the reply so far is not valid under this '{self.param}' (its token {i + 1} of "
                    f"{len(tokens)} does not fit: {_reason(self._m.get_error())}); only a reply made under the same "
                    f"'{self.param}' can be continued: send the request again without 'continue'", "continue")

    def _failed(self) -> "ConstraintFailed":
        return ConstraintFailed(f"'{self.param}': the grammar failed while decoding ({_reason(self._m.get_error())}); "
                                "a simpler schema avoids it", self.param)

    @property
    def finished(self) -> bool:
        return bool(self._m.is_stopped())
