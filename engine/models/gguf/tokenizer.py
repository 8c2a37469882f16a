"""Tokenizers from GGUF metadata, built with the `tokenizers` library.

Two kinds, as llama.cpp names them in `tokenizer.ggml.model`:
- "gpt2": byte-level BPE (vocabulary + merges), with the pre-tokenizer named by
  `tokenizer.ggml.pre`;
- "llama": SentencePiece BPE (vocabulary + scores + byte fallback). The merges are not stored;
  they are rebuilt from the scores as SentencePiece applies them: a pair of pieces may merge
  when their concatenation is a normal piece, and higher-scoring results merge first.
BOS/EOS/unknown/padding come from the metadata, control tokens become special tokens and
user-defined ones added tokens, so each keeps its own id.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from engine.errors import GGUFError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _pre_tokenizer(pre: str) -> Any:
    """llama.cpp's `tokenizer.ggml.pre` names -> the matching HF pre-tokenizer."""
    from tokenizers import Regex
    from tokenizers import pre_tokenizers as pt

    byte_level = pt.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=True)
    raw_bytes = pt.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    if pre in ("default", "gpt-2", "gpt2"):
        return byte_level
    if pre in ("smollm", "starcoder", "refact"):  # digits one by one, then GPT-2 splitting
        return pt.Sequence([pt.Digits(individual_digits=True), byte_level])
    if pre in ("llama3", "llama-bpe", "dbrx", "smaug-bpe"):
        return pt.Sequence([pt.Split(Regex(_LLAMA3_SPLIT), "isolated"), raw_bytes])
    if pre in ("qwen2", "deepseek-r1-qwen"):
        return pt.Sequence([pt.Split(Regex(_QWEN2_SPLIT), "isolated"), raw_bytes])
    raise GGUFError(f"unsupported tokenizer pre-tokenizer {pre!r} (supported: gpt-2, smollm, llama-bpe, qwen2)")


def _vocab(tokens: list[str]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)  # duplicate strings (some GGUFs pad with them): first id wins
    return vocab


def _bpe(md: dict[str, Any], tokens: list[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models

    merges = md.get("tokenizer.ggml.merges")
    if not isinstance(merges, list) or not all(isinstance(m, str) and " " in m for m in merges):
        raise GGUFError("missing or invalid tokenizer.ggml.merges")
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=_vocab(tokens), merges=pairs, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = _pre_tokenizer(str(md.get("tokenizer.ggml.pre", "default")))
    tok.decoder = decoders.ByteLevel()
    return tok


def spm_merges(tokens: list[str], scores: np.ndarray, types: np.ndarray) -> list[tuple[str, str]]:
    """SentencePiece-BPE merges from scores: every split of a normal piece into two known
    pieces, the best-scoring result first (ties: lower ids of the parts first)."""
    vocab = _vocab(tokens)
    found: list[tuple[float, int, int, str, str]] = []
    for piece, i in vocab.items():
        if types[i] != NORMAL or len(piece) < 2:
            continue
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            a, b = vocab.get(left), vocab.get(right)
            if a is not None and b is not None:
                found.append((-float(scores[i]), a, b, left, right))
    found.sort()
    return [(left, right) for _, _, _, left, right in found]


def _spm(md: dict[str, Any], tokens: list[str], types: np.ndarray) -> Any:
    from tokenizers import Tokenizer, decoders, models
    from tokenizers import pre_tokenizers as pt

    scores = md.get("tokenizer.ggml.scores")
    if not isinstance(scores, np.ndarray) or scores.ndim != 1 or len(scores) != len(tokens):
        raise GGUFError("missing or invalid tokenizer.ggml.scores (SentencePiece needs one score per token)")
    unk_id = md.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < len(tokens) else None
    model = models.BPE(vocab=_vocab(tokens), merges=spm_merges(tokens, scores, types), unk_token=unk,
                       fuse_unk=True, byte_fallback=True)
    tok = Tokenizer(model)
    # spaces become "▁"; a leading one is added to the text's first piece only when the model
    # was trained with SentencePiece's add_dummy_prefix (llama.cpp: add_space_prefix)
    prefix = bool(md.get("tokenizer.ggml.add_space_prefix", True))
    tok.pre_tokenizer = pt.Metaspace(replacement="▁", prepend_scheme="first" if prefix else "never", split=False)
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(steps)
    return tok


def build_tokenizer(md: dict[str, Any], max_length: int, template: Optional[str]) -> tuple[Any, dict[str, Any]]:
    """The HF `tokenizers.Tokenizer` and tokenizer_config.json contents from GGUF metadata;
    `template` is the chat template to record (the file's own, or a built-in fallback)."""
    try:
        return _build_tokenizer(md, max_length, template)
    except GGUFError:
        raise
    except Exception as e:  # noqa: BLE001 - `tokenizers` raises plain Exception (e.g. a merge of unknown tokens)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise GGUFError(f"invalid tokenizer in the metadata: {first}") from None


def _build_tokenizer(md: dict[str, Any], max_length: int, template: Optional[str]) -> tuple[Any, dict[str, Any]]:
    from tokenizers import AddedToken, processors

    kind = md.get("tokenizer.ggml.model")
    tokens = md.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise GGUFError("missing or invalid tokenizer.ggml.tokens")
    types = md.get("tokenizer.ggml.token_type", np.full(len(tokens), NORMAL, np.int32))
    if not isinstance(types, np.ndarray) or types.ndim != 1 or len(types) != len(tokens):
        raise GGUFError("tokenizer.ggml.token_type does not match the token list")
    if kind == "gpt2":
        tok = _bpe(md, tokens)
    elif kind == "llama":
        tok = _spm(md, tokens, types)
    else:
        raise GGUFError(f"unsupported tokenizer model {kind!r} (supported: gpt2 byte-level BPE, llama SentencePiece)")
    # control and unknown tokens are special (dropped from decoded text); user-defined ones match
    # verbatim in the input but are kept in decode
    added = [AddedToken(t, special=int(ty) in (CONTROL, UNKNOWN), normalized=False)
             for t, ty in zip(tokens, types.tolist()) if ty in (UNKNOWN, CONTROL, USER_DEFINED)]
    if added:
        tok.add_tokens(added)  # same ids: they are already in the vocab

    def token_at(key: str) -> Optional[str]:
        i = md.get(key)
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    bos, eos = token_at("tokenizer.ggml.bos_token_id"), token_at("tokenizer.ggml.eos_token_id")
    add_bos = bool(md.get("tokenizer.ggml.add_bos_token", kind == "llama")) and bos is not None
    if add_bos:
        bos_id = md["tokenizer.ggml.bos_token_id"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, bos_id)])
    elif kind == "gpt2":
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok_config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": token_at("tokenizer.ggml.unknown_token_id"),
        "pad_token": token_at("tokenizer.ggml.padding_token_id"),
        "add_bos_token": add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
    }
    if template:
        tok_config["chat_template"] = template
    return tok, tok_config
