"""Regenerate docs/screenshot-remote.png: the window attached to the demo model on 3 ranks.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \
        .venv/bin/python docs/make_remote_screenshot.py [--ranks 3] [--model demo]

Starts `python -m engine serve` on N ranks on localhost (ring backend, as tests/cluster.py does
for the multi-rank tests), opens the window offscreen on that server's address (what Models ->
"Connect to a Verbatim server…" does), asks one question, regenerates it (it must come back
identical, with every rank restoring prompt - 1: the script fails otherwise), and grabs the
window with the debug panel open on the regenerated reply (its row per rank). A few minutes on
2 CPU cores with the demo model.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

QUESTION = "What is the capital of France? Answer in one sentence."


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="demo")
    p.add_argument("--ranks", type=int, default=3)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshot-remote.png")
    args = p.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

    from shots import wait_until  # docs/shots.py, beside this script

    from app import build_main_window
    from app.core import ops
    from app.core.store import ChatSettings
    from app.qt.main import ensure_application
    from engine.types import SamplerSettings
    from tests.cluster import Cluster

    tmp = Path(tempfile.mkdtemp(prefix="verbatim-remote-shot-"))
    cluster = Cluster(args.model, args.ranks, tmp / "server-cache", tmp / "logs")
    try:
        cluster.start()
        ensure_application()
        w = build_main_window(cluster.url, tmp / "data", theme="light")
        w.resize(1560, 980)
        errors: list[str] = []
        finished: list = []
        w.chat.notices.error_raised.connect(lambda title, text: errors.append(text))
        w.chat.generation.finished.connect(lambda done: finished.append(done.result))
        wait_until(lambda: w.chat.link.ready or bool(errors), 300)
        if errors:
            raise RuntimeError(errors[-1])
        w.settings.apply(ChatSettings(sampler=SamplerSettings(temperature=0.3, top_p=0.9, max_tokens=40, seed=7),
                                      random_seed=False))
        w.composer.setPlainText(QUESTION)
        w.reply_bar.send()
        wait_until(lambda: not w.chat.generation.busy and bool(finished) or bool(errors))
        ops.regenerate(w.chat, fresh=False)
        wait_until(lambda: not w.chat.generation.busy and len(finished) == 2 or bool(errors))
        if errors:
            raise RuntimeError(errors[-1])
        first, again = finished
        n = again.report.prompt_tokens
        ranks = again.report.ranks
        if (again.tokens != first.tokens or again.logprobs != first.logprobs
                or [r["restored"] for r in ranks] != [n - 1] * args.ranks):
            print("the regenerate was not identical and instant on every rank: no screenshot of that", file=sys.stderr)
            return 1
        w.debug_panel.show()
        w.chat_view.scroll_to_bottom()
        wait_until(lambda: w.debug_panel.rank_box.isVisible() and w.chat.composer.budget is not None
                   and w.debug_panel.value("entries") == "on the server", 120)
        for _ in range(20):
            w.grab()  # let the layout settle
        args.out.parent.mkdir(parents=True, exist_ok=True)
        w.grab().save(str(args.out))
        w.close()
        print(f"wrote {args.out}")
        return 0
    finally:
        cluster.close()


if __name__ == "__main__":
    raise SystemExit(main())
