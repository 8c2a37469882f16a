"""Seeded token sampling with an explicit per-generation random key.

Never the global PRNG: MLX's global random state is per-thread and was seen to freeze inside
`mx.compile` on worker threads (MLX 0.32.0). A generation owns `mx.random.key(seed)` and splits
it once per step, so the same seed gives the same draws in any process or thread.

The key schedule (tests/engine/test_edge_promises.py recomputes sampled tokens from it):

    key_0 = mx.random.key(seed)
    key_{i+1}, step_key_i = mx.random.split(key_i)          # every step i, greedy or not
    token_i = mx.random.categorical(truncate(logprobs_i / T), key=step_key_i)

`logprobs_i` is the step's log-distribution [1, vocab] (after the logits processors) and
`truncate` sets tokens outside top-k / min-p / top-p to -inf. Each step draws with a key of its
own, never used before or again: consecutive draws are independent, and the draw at step i
depends only on the seed and i. A Continue of a reply that has n tokens starts at key_n
(`Sampler(settings, start=n)`): its first draw is the one the unstopped run made at step n.
"""

from __future__ import annotations

from typing import Callable, Optional

import mlx.core as mx

from engine.types import SamplerSettings


# A logits processor, as mlx-lm's `generate_step` takes them: (the tokens so far: the prompt's end
# and the reply; logits [1, vocab] float32) -> logits. A request's processors apply in order to
# every step's logits before the seeded draw (`logits_processors`).
LogitsProcessor = Callable[[Optional[mx.array], mx.array], mx.array]


def logits_processors(settings: SamplerSettings, mask: Optional[Callable[[], mx.array]] = None
                      ) -> list[LogitsProcessor]:
    """A request's processors, in the order they apply: the grammar's mask first (`mask`: the
    allowed next tokens, [1, vocab] bool; engine/generate/constraints.py), so every setting after
    it (penalty, bias, greedy, temperature, truncation) chooses among allowed tokens only and the
    logprob is the constrained distribution's; then the repetition penalty, then the logit bias."""
    out: list[LogitsProcessor] = []
    if mask is not None:
        out.append(lambda tokens, logits: masked(logits, mask()))
    if settings.repetition_penalty != 1.0:
        out.append(repetition_penalty(settings.repetition_penalty, settings.repetition_context))
    if settings.logit_bias:
        out.append(logit_bias(settings.logit_bias))
    return out


def repetition_penalty(penalty: float, context: int) -> LogitsProcessor:
    """The last `context` tokens' logits divided by `penalty` (multiplied, where negative)."""

    def process(tokens: Optional[mx.array], logits: mx.array) -> mx.array:
        if tokens is None or tokens.size == 0:
            return logits
        ids = tokens[-context:]
        picked = logits[:, ids]
        logits[:, ids] = mx.where(picked < 0, picked * penalty, picked / penalty)
        return logits

    return process


def logit_bias(pairs: tuple[tuple[int, float], ...]) -> LogitsProcessor:
    """Each biased token's bias added to its logit (OpenAI's logit_bias; ids already checked
    against the vocabulary by the request's preparation)."""
    ids, values = zip(*pairs)
    id_array, value_array = mx.array(ids, dtype=mx.int32), mx.array(values, dtype=mx.float32)

    def process(tokens: Optional[mx.array], logits: mx.array) -> mx.array:
        logits[:, id_array] = logits[:, id_array] + value_array
        return logits

    return process


class Sampler:
    """The seeded draw of a generation: its processors applied to a step's logits, the
    log-distribution taken, then greedy or tempered and truncated sampling with the step's key."""

    def __init__(self, settings: SamplerSettings, start: int = 0,
                 processors: Optional[list[LogitsProcessor]] = None) -> None:
        self.s = settings
        self.processors = logits_processors(settings) if processors is None else processors
        self._key = mx.random.key(settings.seed)
        for _ in range(start):  # a Continue: the steps the reply so far already drew
            self._key, _ = mx.random.split(self._key)

    def __call__(self, logits: mx.array, history: Optional[mx.array] = None) -> tuple[mx.array, mx.array]:
        """Pick the next token from `logits` [1, vocab]; return lazy (token [1], logprob []).

        Lazy so the decode loop can schedule the next forward before reading this token.
        The logprob is that of the chosen token under the model's distribution after the
        processors (the grammar's mask, the repetition penalty and the logit bias), before
        temperature and truncation: comparable across runs and settings, which is what
        determinism checks compare.
        """
        token, logprob, _ = self.sample(logits, history)
        return token, logprob

    def sample(self, logits: mx.array, history: Optional[mx.array] = None) -> tuple[mx.array, mx.array, mx.array]:
        """`__call__`, plus the whole (lazy) log-distribution [1, vocab] the logprob comes from.
        `history`: the tokens so far, what the processors read."""
        # The key advances every step, greedy or not, so a step's draw never depends on
        # which settings earlier steps used.
        self._key, step_key = mx.random.split(self._key)
        logits = logits.astype(mx.float32)
        for process in self.processors:
            logits = process(history, logits)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        s = self.s
        if s.temperature <= 0:
            token = mx.argmax(logprobs, axis=-1)
        else:
            scores = _truncate(logprobs / s.temperature, s.top_k, s.top_p, s.min_p)
            token = mx.random.categorical(scores, axis=-1, key=step_key)
        return token, mx.take_along_axis(logprobs, token[:, None], axis=-1)[0, 0], logprobs


def masked(logits: mx.array, mask: Optional[mx.array]) -> mx.array:
    """`logits` with the tokens `mask` forbids set to -inf (no mask: unchanged)."""
    if mask is None:
        return logits
    return mx.where(mask, logits, mx.array(-float("inf"), dtype=logits.dtype))


def top_logprobs(logprobs: mx.array, n: int) -> tuple[mx.array, mx.array]:
    """The `n` most likely token ids of a [1, vocab] log-distribution and their logprobs, best
    first (lazy; the same input always gives the same order, ties included)."""
    n = min(n, logprobs.shape[-1])
    row = logprobs[0]
    ids = mx.argpartition(-row, kth=n - 1)[:n]
    vals = row[ids]
    order = mx.argsort(-vals)
    return ids[order], vals[order]


def _truncate(scores: mx.array, top_k: int, top_p: float, min_p: float) -> mx.array:
    """Mask (to -inf) tokens outside top-k, the top-p nucleus and the min-p floor."""
    neg_inf = mx.array(-float("inf"), dtype=scores.dtype)
    vocab = scores.shape[-1]
    if 0 < top_k < vocab:
        kth = mx.sort(scores, axis=-1)[:, vocab - top_k][:, None]
        scores = mx.where(scores < kth, neg_inf, scores)
    if 0.0 < min_p < 1.0:
        probs = mx.softmax(scores, axis=-1)
        floor = probs.max(axis=-1, keepdims=True) * min_p
        scores = mx.where(probs < floor, neg_inf, scores)
    if 0.0 < top_p < 1.0:
        order = mx.argsort(-scores, axis=-1)
        sorted_scores = mx.take_along_axis(scores, order, axis=-1)
        probs = mx.softmax(sorted_scores, axis=-1)
        # Keep a token if the mass strictly before it is below top_p (the top token always stays).
        before = mx.cumsum(probs, axis=-1) - probs
        keep_sorted = before < top_p
        keep = mx.put_along_axis(mx.zeros_like(keep_sorted), order, keep_sorted, axis=-1)
        scores = mx.where(keep, scores, neg_inf)
    return scores
