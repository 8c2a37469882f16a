"""Child process for the disk-cache tests: a fresh interpreter that generates with a cache dir.

Usage: python tests/disk_fault_child.py SPEC.json
SPEC: {"cache_dir": str, "chunk": int, "out": str,
       "runs": [{"model": str, "messages": [...], "max_tokens": int}, ...]}
Each run builds its own Engine on the same cache dir (like an app restart would), generates,
and closes it (which flushes pending writes). Results are written to `out` as JSON after every
run, so a parent that kills this process mid-way still sees what finished.
The writer can be paused at a named point through VERBATIM_DISK_CACHE_HOOK (engine/cache/disk/).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.blas import blas_library  # noqa: E402
from engine.engine import Engine  # noqa: E402
from engine.types import GenerationRequest, SamplerSettings  # noqa: E402


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    out = Path(spec["out"])
    results = []
    for run in spec["runs"]:
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
