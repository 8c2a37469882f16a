"""A request as it will run (`Prepared`), built in one forward pass (`PromptBuilder.prepare`).

The steps, in this order, each done once:

1. check what needs the model: top_logprobs, logit_bias's token ids, the constraint (tools need
   a template that renders them; a forced shape compiles to a grammar), a Continue's reply so far;
2. place the documents at the end of the system message (engine/documents/placement.py);
3. render the whole conversation once through the chat template: its text and its token ids
   (raw text: encoded as is);
4. fit it: a default max_tokens shrinks to the room left; documents that cannot fit beside the
   reply are refused; the conversation is fitted to the context (refused, or its oldest turns
   left out: only then are shorter conversations rendered);
5. the cuts of its canonical schedule: where each message starts, where each earlier reply's
   generation header ends, where each document ends, and the points where a document's state is
   kept (what every conversation about the same files shares).

`loop.stream` (engine/generate/loop.py) takes the result whole; nothing after this renders the
prompt again. The prefix renders of step 5 are memoized per conversation prefix
(templating.MessageStarts), so a growing chat renders only its new turns.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional

from engine.constraint import check_tool_results
from engine.documents.extract import Document
from engine.documents.placement import DocumentSpan, document_costs, document_spans, place
from engine.errors import RequestError
from engine.generate.constraints import Grammars, Guide, tool_format
from engine.generate.context import fit_to_context
from engine.generate.model import LoadedModel
from engine.generate.stops import reply_stops
from engine.generate.templating import MessageStarts, Rendered, Tools, encode_prefix, render, render_text
from engine.types import (
    MAX_TOP_LOGPROBS,
    CacheReport,
    ContextInfo,
    GenerationRequest,
    Message,
    validate_messages,
)


@dataclass(frozen=True)
class Prepared:
    """A request as it will run: the request itself (its documents placed in its messages, its
    max_tokens fitted), its prompt's tokens, how it fits the context, and its schedule's cuts."""

    request: GenerationRequest
    prompt: list[int]
    context: ContextInfo
    message_starts: list[int] = field(default_factory=list)
    # Where each earlier reply's generation header ends but its last token (templating.MessageStarts)
    reply_header_cuts: list[int] = field(default_factory=list)
    # Where each attached document lies in the prompt; its end is a cut (engine/documents/placement.py)
    documents: list[DocumentSpan] = field(default_factory=list)
    # Where a kept ("document") snapshot is taken -> the digests of the documents its state holds:
    # each document's end that is a cut, and the system message's end (after the last document,
    # or a long system turn without any: a harness's prompt), where every conversation with the
    # same system turn still agrees (`kept_points`).
    document_points: dict[int, tuple[str, ...]] = field(default_factory=dict)
    earlier: list[int] = field(default_factory=list)  # a Continue: the reply so far (token ids)
    grammar: Optional[str] = None  # the constraint's checked grammar (None: decoding is free)

    def describe(self, report: CacheReport) -> None:
        """The parts of a generation's report that preparing it decided: the context fit, the
        reply header cuts (each inside (0, n - 1), so all are cuts), and each document's span
        with where its state came from."""
        report.context = self.context
        report.reply_header_cuts = list(self.reply_header_cuts)
        restored, source = report.restored, report.source
        report.documents = [
            {"name": s.name, "digest": s.digest, "start": s.start, "end": s.end, "tokens": s.tokens, "cut": s.cut,
             "source": source if source and restored >= s.end else "prefilled",
             **({"unread": list(s.unread)} if s.unread else {})} for s in self.documents]


class PromptBuilder:
    """Prepares the requests for one loaded model: its tokenizer's renders (memoized prefixes)
    and its compiled grammars (cached per namespace) live here."""

    def __init__(self, lm: LoadedModel) -> None:
        self.lm = lm
        self.starts = MessageStarts(lm.tokenizer)
        self.grammars = Grammars(lm.tokenizer, lm.vocab_size, lm.eos_ids)

    def measure(self, request: GenerationRequest, limit: Optional[int]) -> ContextInfo:
        """The whole prompt of `request` in tokens (nothing left out, nothing refused) and the
        limit in force for it: what a context meter counts before Send; prepare() then fits it."""
        if request.prompt is not None:
            return ContextInfo(limit, len(render_text(self.lm.tokenizer, request.prompt)))
        messages = place(validate_messages(request.messages), request.documents)
        return ContextInfo(limit, len(render(self.lm.tokenizer, messages, tools=_tools(request),
                                             options=request.template_options).ids))

    def prepare(self, request: GenerationRequest, limit: Optional[int]) -> Prepared:
        """`request` as it will run within `limit` tokens (None: no limit known): checked, its
        prompt rendered and fitted (or refused with a one-line error before any prefill), and
        its schedule's cuts."""
        tok = self.lm.tokenizer
        grammar = self._check(request)
        earlier = self._reply_so_far(request, grammar is not None)
        if grammar is not None and earlier:
            assert request.constraint is not None
            self.grammars.guide(grammar, request.constraint.failure_param).check_reply_so_far(earlier)
        if request.prompt is not None:  # raw text: nothing to place or leave out, no message boundaries
            prompt = render_text(tok, request.prompt)
            request = _fit_max_tokens(request, len(prompt), limit)
            fit_to_context(lambda m: Rendered(prompt, None), [], request.sampler.max_tokens, limit, "refuse")
            return Prepared(request, prompt, ContextInfo(limit, len(prompt)), earlier=earlier, grammar=grammar)
        tools, options = _tools(request), request.template_options
        messages = place(validate_messages(request.messages), request.documents)
        whole = render(tok, messages, tools=tools, options=options)
        request = _fit_max_tokens(request, len(whole.ids), limit)
        if request.documents:
            self._check_documents_fit(messages, whole, request, limit, tools)
        fitted = fit_to_context(lambda m: render(tok, m, tools=tools, options=options), messages,
                                request.sampler.max_tokens, limit, request.context_policy,
                                lambda m: len(tok.encode(m["content"])) + 4, whole=whole)
        prompt = fitted.rendered.ids
        starts = self.starts(fitted.messages, prompt, tools, options)
        headers = self.starts.reply_header_cuts(fitted.messages, prompt, tools, options)
        spans: list[DocumentSpan] = []
        if request.documents:
            spans = document_spans(self._encode, fitted.messages, request.documents, prompt, fitted.rendered.text)
            starts = sorted(set(starts) | {s.end for s in spans if s.cut})
        # The system turn: the leading system messages (Codex CLI sends two), the tools with them.
        lead = next((i for i, m in enumerate(fitted.messages) if m.get("role") != "system"), len(fitted.messages))
        points = kept_points(spans, self.starts.end_of(fitted.messages[:lead], prompt, tools, options))
        # The request as it runs: its documents are now in its messages (placed once, never twice).
        return Prepared(replace(request, messages=fitted.messages, documents=()), prompt,
                        ContextInfo(limit, len(prompt), fitted.dropped), starts, headers, spans, points, earlier,
                        grammar)

    def _encode(self, text: str, content_at: int) -> list[int]:
        """A prefix of a rendered prompt as the prompt encodes it (placement.Encode)."""
        return encode_prefix(self.lm.tokenizer, text, content_at)

    def document_tokens(self, documents: tuple[Document, ...], system_prompt: str = "") -> list[int]:
        """What each of `documents` costs in a conversation with `system_prompt` about them
        (placement.document_costs: its block and the separator before it, the count a refusal
        and the report's spans give), in placement order."""
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        placed = place(messages + [{"role": "user", "content": "?"}], documents)
        whole = render(self.lm.tokenizer, placed)
        return document_costs(self._encode, placed, documents, whole.ids, whole.text)

    def guide(self, p: Prepared) -> Optional[Guide]:
        """A new guide through `p`'s grammar for one generation (None: decoding is free)."""
        if p.grammar is None:
            return None
        assert p.request.constraint is not None
        return self.grammars.guide(p.grammar, p.request.constraint.failure_param)

    # -- step 1: what needs the model

    def _check(self, request: GenerationRequest) -> Optional[str]:
        """The request's fields that need the model, checked before any prefill; its grammar.
        Tools need a template that renders them and a tool-call format mlx-lm can parse; tool
        results must answer calls made; a forced shape must compile."""
        if not 0 <= request.top_logprobs <= MAX_TOP_LOGPROBS:
            raise RequestError(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}")
        named = self.lm.named_tokens
        for token, _ in request.sampler.logit_bias:
            if token >= named:
                raise RequestError(f"logit_bias: token id {token} is not in the model's vocabulary "
                                   f"(ids 0 to {named - 1})")
        c = request.constraint
        if request.prompt is None:
            check_tool_results(request.messages)
        elif request.template_options:
            raise RequestError("'template_options' need a chat (messages), not a raw prompt", "template_options")
        if c is None:
            return None
        if c.tools and tool_format(self.lm.tokenizer) is None:
            raise RequestError("'tools': this model's chat template has no tool calling (mlx-lm finds no "
                               "tool-call format in it), so it cannot be offered tools", "tools")
        if c.tools and request.prompt is not None:
            raise RequestError("'tools' need a chat (messages), not a raw prompt", "tools")
        # Compiled grammars are cached per namespace: another API key's schema costs a compile.
        return self.grammars.grammar(c, request.cache_namespace)

    def _reply_so_far(self, request: GenerationRequest, constrained: bool) -> list[int]:
        """A Continue's reply so far as token ids, checked: a reply that ended (an end token, a
        stop string in its free text) or already has max_tokens has nothing to continue."""
        c = request.continuation
        if c is None:
            return []
        tok = self.lm.tokenizer
        tokens = list(c.tokens) if c.tokens else (
            list(tok.encode(c.text, add_special_tokens=False)) if c.text else [])
        if not tokens:
            raise RequestError("continue: the reply so far is empty (send the request again instead)", "continue")
        vocab = self.lm.vocab_size
        bad = next((t for t in tokens if not isinstance(t, int) or not 0 <= t < vocab), None)
        if bad is not None:
            raise RequestError(f"continue: {bad!r} is not a token id of this model", "continue")
        if any(t in self.lm.reply_ends for t in tokens):
            raise RequestError("continue: the reply ended (it holds an end token); nothing to continue", "continue")
        silent = self.lm.no_text
        text = tok.decode([t for t in tokens if t not in silent])
        at = reply_stops(request, tok, constrained).find(text, final=True)
        if at is not None:
            hit = next(s for s in request.stop if s and text.startswith(s, at))
            raise RequestError(f"continue: the reply ended at the stop string {hit!r}; nothing to continue",
                               "continue")
        if len(tokens) >= request.sampler.max_tokens:
            raise RequestError(f"continue: the reply already has {len(tokens)} tokens and max_tokens "
                               f"({request.sampler.max_tokens}) counts the whole reply: raise it to continue",
                               "max_tokens")
        return tokens

    # -- step 4: fit

    def _check_documents_fit(self, placed: list[Message], whole: Rendered, request: GenerationRequest,
                             limit: Optional[int], tools: Tools) -> None:
        """Documents that cannot fit beside the reply are refused before any prefill, with the
        numbers: never truncated, never left out by the context policy. What they take is the
        system message they end, rendered alone (the memoized render step 5 reads again); each
        one's size is its cost in the whole prompt (placement.document_costs)."""
        if not limit:
            return
        options = request.template_options
        ids = self.starts.rendered(placed[:1], tools, generation=False, options=options)
        if ids is None:  # a template that will not render the system message alone: its own error
            ids = render(self.lm.tokenizer, placed[:1], add_generation_prompt=False, tools=tools, options=options).ids
        n = len(ids)
        room = limit - request.sampler.max_tokens
        if n <= room:
            return
        costs = document_costs(self._encode, placed, request.documents, whole.ids, whole.text)
        sizes = ", ".join(f"{d.name} {n:,}" for d, n in zip(request.documents, costs))
        raise RequestError(f"the documents take {n:,} tokens with the system prompt ({sizes}); the context holds "
                           f"{limit:,} with {request.sampler.max_tokens:,} kept for the reply, so at most "
                           f"{max(room, 0):,} fit: attach fewer pages or documents, or use a model with a longer "
                           "context", "documents")


def _tools(request: GenerationRequest) -> Optional[list[dict[str, Any]]]:
    """The tools the chat template shows for `request` (None: none offered)."""
    return list(request.constraint.tools) if request.constraint is not None and request.constraint.tools else None


def _fit_max_tokens(request: GenerationRequest, n_prompt: int, limit: Optional[int]) -> GenerationRequest:
    """A default max_tokens (`max_tokens_fit`) shrunk to the room the whole prompt leaves in the
    context (a prompt that leaves no room at all is still refused by fit_to_context, with its
    usual message)."""
    if not request.max_tokens_fit or not limit:
        return request
    room = limit - n_prompt
    if 1 <= room < request.sampler.max_tokens:
        return replace(request, sampler=replace(request.sampler, max_tokens=room))
    return request


# A system turn at least this long (tokens, the tools the template shows in it included) is kept
# warm on its own, without documents: a harness's (Codex CLI, Claude Code) opens every session with
# the same thousands of tokens. A shorter one costs less to prefill than to look up and keep.
KEPT_SYSTEM_MIN = 512


def kept_points(spans: list[DocumentSpan], system_end: Optional[int]) -> dict[int, tuple[str, ...]]:
    """Where a kept snapshot is taken (kind "document": what eviction keeps ahead of turns and a
    restart reads ahead, engine/cache/eviction.py) -> the digests of the documents the state there
    holds. Each document end (a cut) -> the documents up to it; and the system turn's end
    (`system_end`: where the first message after the leading system messages starts, when those
    rendered alone are a prefix of the prompt) -> all of them, after the last document, or none when
    the system turn is KEPT_SYSTEM_MIN tokens or more. The cuts before it are the chunk multiples
    and the system messages' own ends, so its state is bit-identical in every conversation with the
    same system turn (and tools, and template options): a new one restores up to where its own
    first message starts. The documents end the first system message (placement.place), so what
    lies between the last one's end and there is the template's own closing of the message (no
    forward of those few tokens first, which at a long context costs about what the question's
    own forward does)."""
    points = {s.end: tuple(d.digest for d in spans[: i + 1]) for i, s in enumerate(spans) if s.cut}
    if system_end is not None and (system_end > spans[-1].end if spans else system_end >= KEPT_SYSTEM_MIN):
        points[system_end] = tuple(d.digest for d in spans)
    return points
