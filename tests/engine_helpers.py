"""Shared helpers for engine tests: tiny models per cache family and the OpenBLAS check."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from engine.blas import optimized_blas
from engine.engine import Engine
from engine.types import GenerationRequest, SamplerSettings
from tests.tiny_models import FAMILIES, build_model

ALL_FAMILIES = list(FAMILIES)

QUESTIONS = [
    "Why is the sky blue?",
    "Explain how a prompt cache works in two sentences.",
    "The capital of France is",
    "def add(a, b):",
    "Regenerate the answer, please.",
    "Tell me about café and naïve señor.",
    "0123456789 what comes next?",
    "The quick brown fox",
    "You are a helpful assistant. Answer briefly: what is Rome?",
]


def model_dir(root: Path, family: str) -> Path:
    return build_model(root / family, family)


def make_engine(folder: Path, chunk: int = 8, **kw) -> Engine:
    kw.setdefault("use_disk", False)
    eng = Engine(chunk=chunk, **kw)
    eng.load(str(folder))
    return eng


def request(messages, mode: str = "exact", max_tokens: int = 16, **sampler) -> GenerationRequest:
    return GenerationRequest(messages, SamplerSettings(max_tokens=max_tokens, **sampler), mode=mode)


def cold_request(req: GenerationRequest) -> GenerationRequest:
    """The same request with no cache at all (neither looked up nor stored)."""
    return dataclasses.replace(req, use_cache=False)


def require_openblas() -> None:
    """Determinism controls only bite with an optimized BLAS (DESIGN.md): fail in CI, skip locally."""
    if optimized_blas():
        return
    msg = ("OpenBLAS is not preloaded: the forward-width effect these tests control for does not show "
           "with MLX's reference BLAS. Run the suite via `make test` (apt-get install libopenblas0-pthread).")
    if os.environ.get("CI") or os.environ.get("VERBATIM_REQUIRE_OPENBLAS"):
        pytest.fail(msg)
    pytest.skip(msg)
