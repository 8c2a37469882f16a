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

Whitespace is bounded: JSON comes out with fixed separators (", " and ": ", the style chat
templates render tool calls in) and no other whitespace, so a weak model cannot spend its
tokens on newlines.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Optional

import numpy as np

from engine.constraint import Constraint
from engine.errors import EngineError, RequestError

# JSON layout inside every grammar: no free whitespace, separators as templates write them.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_PARALLEL_CALLS = 8  # tool calls one forced reply may make
_COMPILED_KEPT = 64  # grammars remembered per model (an agent sends the same tools every step)


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


class Grammars:
    """One per loaded model: the llguidance view of its tokenizer (built on first use) and the
    grammars of the constraints it was asked for."""

    def __init__(self, tokenizer: Any, width: int, eos_ids: set[int]) -> None:
        self._tok = tokenizer
        self.width = width  # the logits' width (may exceed the tokenizer's vocabulary)
        self._eos = sorted(eos_ids)
        self._ll: Any = None
        self._compiled: "OrderedDict[str, str]" = OrderedDict()

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

    def grammar(self, constraint: Optional[Constraint]) -> Optional[str]:
        """The checked grammar of `constraint` (None when it does not constrain decoding);
        RequestError naming the field when it cannot be compiled."""
        if constraint is None or not constraint.decoding:
            return None
        key = constraint.identity()
        if key in self._compiled:
            self._compiled.move_to_end(key)
            return self._compiled[key]
        from llguidance import LLMatcher

        param = "tools" if constraint.forced_tool else "response_format"
        try:
            grammar = (self._tool_grammar(constraint) if constraint.forced_tool
                       else _json_grammar(constraint.response_format or {}))
        except (ValueError, TypeError) as e:
            raise RequestError(f"'{param}': the grammar cannot be built: {e}", param) from None
        failed, messages = LLMatcher.validate_grammar_with_warnings(grammar, self._lltokenizer())
        if failed:
            raise RequestError(f"'{param}' cannot be compiled into a grammar: {messages[0]}", param)
        self._compiled[key] = grammar
        while len(self._compiled) > _COMPILED_KEPT:
            self._compiled.popitem(last=False)
        return grammar

    def guide(self, grammar: str) -> "Guide":
        from llguidance import LLMatcher

        matcher = LLMatcher(self._lltokenizer(), grammar, log_level=0)
        if matcher.is_error():
            raise EngineError(f"the grammar failed to start: {matcher.get_error()}")
        return Guide(matcher, self.width)

    def _tool_grammar(self, c: Constraint) -> str:
        """A Lark grammar for the reply of a forced tool call, in the model's own markup. Only
        the JSON tool format (`<tool_call>{"name": ..., "arguments": ...}</tool_call>`, Qwen,
        Hermes and others) is forced; other families' formats get a 400."""
        fmt = tool_format(self._tok)
        if fmt != "json_tools":
            raise RequestError(f"'tool_choice' {c.tool_choice!r} is enforced only for models whose tool calls are "
                               f"JSON (mlx-lm's json_tools format); this model's format is {fmt or 'unknown'}: "
                               "use 'auto'", "tool_choice")
        names = [c.function] if c.tool_choice == "function" else c.tool_names()
        options = []
        for name in names:
            tool = c.tool(name) or {}
            params = tool.get("function", {}).get("parameters") or {"type": "object"}
            options.append({"type": "object", "properties": {"name": {"const": name}, "arguments": params},
                            "required": ["name", "arguments"], "additionalProperties": False})
        body = {"x-guidance": {**JSON_OPTIONS, "lenient": True},
                **(options[0] if len(options) == 1 else {"anyOf": options})}
        start = self._marker(self._tok.tool_call_start)
        end = self._marker(self._tok.tool_call_end)
        # Parallel calls: at most MAX_PARALLEL_CALLS, so a weak model cannot call forever.
        calls = f'call ("\\n" call){{0,{MAX_PARALLEL_CALLS - 1}}}' if c.parallel_tool_calls else "call"
        return (f"start: {calls}\n"
                f"call: {start} \"\\n\" body \"\\n\" {end}\n"
                f"body: %json {json.dumps(body)}\n")


    def _marker(self, text: str) -> str:
        """A tool-call marker in Lark: the one token that spells it when the tokenizer has one
        (llguidance reads added tokens as special: `<[id]>`), else its text as a string."""
        ids = self._tok.encode(text, add_special_tokens=False)
        ll = self._lltokenizer()
        if len(ids) == 1 and ll.is_special_token(int(ids[0])):
            return f"<[{int(ids[0])}]>"
        return json.dumps(text)


def _json_grammar(fmt: dict[str, Any]) -> str:
    from llguidance import LLMatcher

    if fmt.get("type") == "json_object":
        return LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=dict(JSON_OPTIONS))  # type: ignore[arg-type]
    overrides = {**JSON_OPTIONS, "lenient": not fmt.get("strict", False)}
    return LLMatcher.grammar_from_json_schema(fmt["schema"], overrides=overrides)  # type: ignore[arg-type]


class Guide:
    """One generation's grammar state: the mask of the next token, and each token fed to it."""

    def __init__(self, matcher: Any, width: int) -> None:
        from llguidance.numpy import allocate_token_bitmask

        self._m = matcher
        self.width = width
        self._bits = allocate_token_bitmask(1, width)

    def mask(self) -> Any:
        """The allowed next tokens as a boolean MLX array [1, width]."""
        import mlx.core as mx
        from llguidance.numpy import fill_next_token_bitmask

        fill_next_token_bitmask(self._m, self._bits, 0)
        allowed = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self.width].astype(bool)
        return mx.array(allowed)[None, :]

    def consume(self, token: int) -> None:
        """Advance past `token` (one the mask allowed)."""
        if not self._m.consume_token(token):
            raise EngineError(f"the grammar refused token {token}: {self._m.get_error()}")

    @property
    def finished(self) -> bool:
        return bool(self._m.is_stopped())
