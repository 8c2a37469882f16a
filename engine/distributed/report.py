"""Each rank's cache report, gathered to rank 0 after every generation.

The `verbatim` object of a response keeps rank 0's figures at the top level and gains
`world_size` and `ranks`: one entry per rank with what its own cache did. The ranks also
compare a digest of the tokens they generated: they must all agree (one forward, sharded),
and a report that says otherwise carries a warning rather than hiding it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Optional

from engine.distributed.group import Group
from engine.types import GenerationResult


def rank_report(group: Group, result: Optional[GenerationResult], error: Optional[BaseException]) -> dict[str, Any]:
    """What this rank's cache did for one generation (or the error it raised)."""
    out: dict[str, Any] = {"rank": group.rank, "host": group.host}
    if result is None:
        out["error"] = f"{type(error).__name__}: {error}" if error is not None else "no result"
        return out
    r = result.report
    out.update({
        "restored": r.restored,
        "source": r.source,
        "stored": r.stored,
        "layer_offsets": list(r.layer_offsets),
        "declines": list(r.declines),
        "tokens_digest": hashlib.sha256(json.dumps(result.tokens).encode()).hexdigest()[:16],
    })
    return out


def gather_reports(group: Group, mine: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's report, in rank order (on every rank)."""
    blobs = group.gather_bytes(json.dumps(mine).encode(), "report")
    return [json.loads(b) for b in blobs]


def attach(result: GenerationResult, ranks: list[dict[str, Any]]) -> None:
    """Put the ranks' reports into rank 0's result (top-level figures stay rank 0's)."""
    report = result.report
    report.world_size = len(ranks)
    report.ranks = ranks
    digests = {r.get("tokens_digest") for r in ranks}
    if len(digests) > 1:
        report.warnings.append("the ranks generated different tokens: the distributed run is out of step")
