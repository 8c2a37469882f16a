"""Token ids as the text and UTF-8 bytes that logprobs report (`TokenNamer`).

A token that decodes to part of a character (U+FFFD) is reported by its raw bytes, as OpenAI
does: a byte-level BPE piece ("Ġ..." alphabet) or a SentencePiece byte ("<0xE2>"). The namer
uses the tokenizer, so it runs on the engine thread.
"""

from __future__ import annotations

from typing import Any, Optional

from engine.serve.report import TokenLogprob, TokenText
from engine.types import GenerationResult


class TokenNamer:
    """Token id -> (text, UTF-8 bytes) for logprobs, memoised (engine thread only)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self._memo: dict[int, TokenText] = {}

    def __call__(self, token: int) -> TokenText:
        out = self._memo.get(token)
        if out is None:
            out = self._memo[token] = _token_text(self._tok, token)
        return out

    def entry(self, token: int, logprob: float, top: Optional[list[tuple[int, float]]]) -> TokenLogprob:
        return TokenLogprob(self(token), logprob, [(self(t), lp) for t, lp in top] if top is not None else None)

    def entries(self, result: GenerationResult) -> list[TokenLogprob]:
        """Every token of a finished reply, with its logprob (and top alternatives when asked)."""
        tops = result.top_logprobs or [None] * len(result.tokens)
        return [self.entry(t, lp, top) for t, lp, top in zip(result.tokens, result.logprobs, tops)]


def _token_text(tok: Any, token: int) -> TokenText:
    text = tok.decode([token])
    if "\ufffd" not in text:
        return text, list(text.encode("utf-8"))
    raw = _piece_bytes(tok, token)  # part of a character: report its bytes, as OpenAI does
    if raw is None:
        return text, list(text.encode("utf-8"))
    return raw.decode("utf-8", errors="replace"), list(raw)


_BYTE_DECODER: Optional[dict[str, int]] = None


def _piece_bytes(tok: Any, token: int) -> Optional[bytes]:
    """Raw bytes of a byte-level BPE piece ("Ġ..." alphabet) or a SentencePiece byte ("<0xE2>")."""
    global _BYTE_DECODER
    try:
        piece = tok.convert_ids_to_tokens(token)
    except Exception:
        return None
    if not isinstance(piece, str):
        return None
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return bytes([int(piece[3:5], 16)])
        except ValueError:
            return None
    if _BYTE_DECODER is None:
        # GPT-2's reversible byte <-> printable character table.
        bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
        cs = bs[:]
        n = 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        _BYTE_DECODER = {chr(c): b for b, c in zip(bs, cs)}
    if all(ch in _BYTE_DECODER for ch in piece):
        return bytes(_BYTE_DECODER[ch] for ch in piece)
    return None
