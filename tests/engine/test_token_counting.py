"""Counting tokens is not running the model (issue 50, item 8): a conversation longer than the
tokenizer's `model_max_length` is counted (the context meter) and fitted without transformers'
"Token indices sequence length is longer than the specified maximum" warning in the log."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Iterator

import pytest

from engine.engine import Engine
from engine.types import GenerationRequest, SamplerSettings
from tests.engine_helpers import model_dir

WARNING = "Token indices sequence length is longer than the specified maximum"


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def transformers_log() -> Iterator[Records]:
    """What transformers' tokenizer logs (its loggers do not propagate to pytest's caplog)."""
    logger = logging.getLogger("transformers.tokenization_utils_base")
    handler = Records()
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def test_counting_a_conversation_longer_than_the_tokenizers_maximum_logs_no_warning(
        tmp_path: Path, transformers_log: Records) -> None:
    folder = model_dir(tmp_path, "llama")
    cfg = folder / "tokenizer_config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "model_max_length": 64}))
    eng = Engine(use_disk=False, chunk=16)
    eng.load(str(folder))
    try:
        assert eng.lm.tokenizer.model_max_length == 64
        long = [{"role": "user", "content": "The quick brown fox jumps over the lazy dog. " * 30}]
        req = GenerationRequest(long, SamplerSettings(max_tokens=2))
        assert eng.measure(req).prompt_tokens > 64  # counted past the tokenizer's maximum
        assert eng.generate(req).report.prompt_tokens > 64  # and run: the model's own context is 4096
        assert not [m for m in transformers_log.messages if m.startswith(WARNING)], transformers_log.messages
        # The logger still passes its other messages on.
        logging.getLogger("transformers.tokenization_utils_base").warning("something else")
        assert transformers_log.messages[-1] == "something else"
    finally:
        eng.close()
