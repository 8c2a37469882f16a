"""Child process for the disk-cache tests: a fresh interpreter that generates with a cache dir.

Usage: python tests/disk_fault_child.py SPEC.json
SPEC: {"cache_dir": str, "chunk": int, "out": str,
       "runs": [{"model": str, "messages": [...], "max_tokens": int}, ...],
       "hook": {"trace": str, "sleep": {point: seconds}, "after_done": int}   (optional)}
Each run builds its own Engine on the same cache dir (like an app restart would), generates,
and closes it (which flushes pending writes). Results are written to `out` as JSON after every
run, so a parent that kills this process mid-way still sees what finished.
With "hook", the disk writer appends every point it reaches (engine/cache/disk/hooks.py) to the
"trace" file and sleeps at the named ones (once "after_done" saves have finished), so that the
parent can kill it exactly there.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.blas import blas_library  # noqa: E402
from engine.cache.disk.hooks import WriterHooks  # noqa: E402
from engine.cache.disk.tier import DiskCache  # noqa: E402
from engine.cache.prompt_cache import PromptCache  # noqa: E402
from engine.engine import Engine  # noqa: E402
from engine.types import GenerationRequest, SamplerSettings  # noqa: E402


class TraceHooks(WriterHooks):
    partial_file = True  # flush the temp file before "temp_partial": the kill must find it partial

    def __init__(self, spec: dict) -> None:
        self.trace = spec.get("trace")
        self.sleep = spec.get("sleep") or {}
        self.after_done = int(spec.get("after_done", 0))  # sleep only once this many saves finished
        self.done = 0

    def point(self, name: str) -> None:
        if self.trace:
            with open(self.trace, "a") as f:
                f.write(name + "\n")
        if name == "done":
            self.done += 1
        if self.sleep.get(name) and self.done >= self.after_done:
            time.sleep(float(self.sleep[name]))  # the parent kills this process meanwhile


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    out = Path(spec["out"])
    results = []
    hooks = TraceHooks(spec["hook"]) if spec.get("hook") else None  # one for all runs: it counts saves
    for run in spec["runs"]:
        if hooks is not None:
            eng = Engine(use_disk=False, chunk=int(spec.get("chunk", 8)))
            eng.cache = PromptCache(disk=DiskCache(Path(spec["cache_dir"]), hooks=hooks))
        else:
            eng = Engine(cache_dir=Path(spec["cache_dir"]), chunk=int(spec.get("chunk", 8)))
        eng.load(run["model"])
        req = GenerationRequest(run["messages"], SamplerSettings(max_tokens=int(run.get("max_tokens", 16))))
        r = eng.generate(req)
        results.append({
            "model": run["model"],
            "tokens": r.tokens,
            "logprobs": r.logprobs,
            "report": r.report.to_dict(),
            "blas": blas_library(),  # what MLX's sgemm binds to (numpy's own OpenBLAS does not count)
        })
        out.write_text(json.dumps(results))
        eng.close()
        results[-1]["disk"] = eng.cache.disk.stats() if eng.cache.disk is not None else None
        out.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
