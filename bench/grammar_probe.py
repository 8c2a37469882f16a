"""Issue 36: what the pre-prefill checks of a grammar cost (engine/generate/constraints.py).

Every compiled grammar (once per cache namespace; cached after) is validated by llguidance and
probed: two walks of 24 tokens (always the lowest, always the highest allowed id), where limits
such as llguidance's row size or lexer budget show before any prefill. This times both, medians
of 5, for the tests' JSON Schema, on each model folder given (its tokenizer's width is what the
mask's cost grows with).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 PYTHONPATH=. \
        .venv/bin/python bench/grammar_probe.py MODEL_FOLDER [MODEL_FOLDER ...]
"""

from __future__ import annotations

import statistics
import sys
import time

from llguidance import LLMatcher

from engine.engine import Engine
from engine.generate.constraints import _json_rule
from tests.tool_fixtures import SCHEMA


def main(folders: list[str]) -> None:
    print("| tokenizer width | validate (ms) | probe, 2 x 24 tokens (ms) |\n|---:|---:|---:|")
    for folder in folders:
        engine = Engine(use_disk=False)
        engine.load(folder)
        g = engine.builder.grammars
        assert g is not None
        grammar = f"start: {_json_rule(SCHEMA, True)}\n"
        ll = g._lltokenizer()
        validate, probe = [], []
        for _ in range(5):
            t = time.perf_counter()
            LLMatcher.validate_grammar_with_warnings(grammar, ll)
            validate.append(time.perf_counter() - t)
            t = time.perf_counter()
            assert g._probe(grammar) is None
            probe.append(time.perf_counter() - t)
        print(f"| {g.width} | {statistics.median(validate) * 1e3:.2f} | {statistics.median(probe) * 1e3:.2f} |")
        engine.close()


if __name__ == "__main__":
    main(sys.argv[1:])
