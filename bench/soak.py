"""The soak tests, for longer: the real window's session rounds (tests/gui/soak_window.py) for
--minutes, then --requests through one `engine serve` process (tests/soak_server.py), printing
None's reference count, RSS, threads, open files and widgets after every round / every --every
requests, and the growth after warm-up at the end.

    .venv/bin/python bench/soak.py --minutes 10 --requests 20000      # (offscreen Qt)
    .venv/bin/python bench/soak.py --minutes 0 --requests 5000        # the server only

The test suite runs the same rounds a dozen times (tests/gui/test_soak_window.py) and 2,000 requests
(tests/test_soak_server.py) with bounds; this prints the curve, to see whether memory levels off.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def window(model: Path, data: Path, minutes: float, reply_tokens: int) -> None:
    from PySide6.QtCore import QCoreApplication, QDeadlineTimer
    from PySide6.QtWidgets import QApplication

    from app import build_main_window
    from app.core.store import ChatSettings
    from engine.types import SamplerSettings
    from tests.soak_probes import sample
    from tests.gui.soak_window import WindowSoak

    app = QApplication.instance() or QApplication([])

    def wait(cond, ms: int) -> None:  # the event loop turns until `cond` holds (a stuck step fails)
        deadline = QDeadlineTimer(ms)
        while not cond():
            if deadline.hasExpired():
                raise TimeoutError("a soak step did not finish")
            QCoreApplication.processEvents()

    w = build_main_window(str(model), data, chunk=16)
    w.show()
    wait(lambda: w.chat.link.ready, 120_000)
    w.settings.apply(ChatSettings(sampler=SamplerSettings(temperature=0.9, top_p=0.95, max_tokens=reply_tokens,
                                                          seed=7), random_seed=False))
    soak = WindowSoak(w, wait)
    end, i, first = time.monotonic() + 60 * minutes, 0, None
    while time.monotonic() < end:
        report = soak.round()
        s = sample(i, len(QApplication.allWidgets()))
        first = first or s
        print(f"round {i}: {report.tokens} tokens, {report.replies} replies; {s.line()}", flush=True)
        i += 1
    if first is not None:
        print(f"window: {i} rounds; RSS {first.rss_mb:.0f} -> {s.rss_mb:.0f} MB, widgets {first.widgets} -> "
              f"{s.widgets}, OS threads {first.tasks} -> {s.tasks}, fds {first.fds} -> {s.fds}, "
              f"None's refs {first.none_refs} -> {s.none_refs}")
    w.close()


def server(model: Path, cache: Path, requests: int, every: int) -> None:
    from tests.soak_probes import sample_pid
    from tests.soak_server import Requests, serve, stop

    p, port = serve(model, cache)
    reqs = Requests(port, model.name)
    first = last = None
    try:
        for i in range(requests):
            reqs.one(i)
            if (i + 1) % every == 0:
                last = sample_pid(i + 1, p.pid)
                first = first or last
                print(last.line(), flush=True)
    finally:
        reqs.close()
        stop(p)
    if first is not None and last is not None:
        print(f"server: {requests} requests; RSS {first.rss_mb:.1f} -> {last.rss_mb:.1f} MB, OS threads "
              f"{first.tasks} -> {last.tasks}, fds {first.fds} -> {last.fds}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=5.0, help="window rounds for this long (0: none)")
    ap.add_argument("--reply-tokens", type=int, default=400)
    ap.add_argument("--requests", type=int, default=10_000, help="server requests (0: none)")
    ap.add_argument("--every", type=int, default=500, help="requests between samples")
    args = ap.parse_args()
    from tests.tiny_models import build_model

    with tempfile.TemporaryDirectory() as d:
        model = build_model(Path(d) / "llama", family="llama")
        if args.minutes > 0:
            window(model, Path(d) / "data", args.minutes, args.reply_tokens)
        if args.requests > 0:
            server(model, Path(d) / "cache", args.requests, args.every)


if __name__ == "__main__":
    main()
