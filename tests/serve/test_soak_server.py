"""One server process lasts (issue 40): 2,000 requests of ten kinds (tests/soak_server.py: chat
replies, streams, a stream left mid-way, bad requests, fresh and kept-alive connections, a
half-sent head) through one `python -m engine serve` on 127.0.0.1. Every reply is right, and
after warm-up the server's memory, OS threads and open descriptors (its /proc) stay within
bounds. bench/soak.py --server runs the same mix for minutes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.soak_probes import Bounds, sample_pid
from tests.soak_server import Requests, serve, stop

pytestmark = [pytest.mark.soak, pytest.mark.linux_only]  # reads the server's /proc/<pid>

REQUESTS = 2_000
EVERY = 200  # requests between samples
WARM_UP = 400  # requests before the baseline: MLX kernels, the prompt cache's first entries
# The prompt cache fills with the four prompts' entries in warm-up; what may grow after is the
# allocator's and SQLite's slack, not a request's worth each time. Descriptors: the listening
# socket, the cache and a few connections closing at the moment of a sample.
BOUNDS = Bounds(rss_mb=40, tasks=2, fds=6)


def test_thousands_of_requests_through_one_server_process_stay_bounded(tiny_model: Path, tmp_path: Path) -> None:
    p, port = serve(tiny_model, tmp_path / "cache")
    reqs = Requests(port, tiny_model.name)
    samples = []
    try:
        for i in range(REQUESTS):
            reqs.one(i)
            if (i + 1) % EVERY == 0:
                s = sample_pid(i + 1, p.pid)
                samples.append(s)
                print(f"\n{s.line()}")
        assert p.poll() is None  # it lives
        status = json.loads(reqs._kept("GET", "/verbatim/status")[1])
    finally:
        reqs.close()
        rest = stop(p)
    assert all(n == REQUESTS // len(Requests.KINDS) for n in reqs.done.values()), reqs.done
    warm = next(s for s in samples if s.step == WARM_UP)
    later = [s for s in samples if s.step > WARM_UP]
    broken = BOUNDS.broken(warm, later)
    assert broken == [], f"{broken}\nstatus at the end: {status}\nstderr: {rest[-2000:]}"
