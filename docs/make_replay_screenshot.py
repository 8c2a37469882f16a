"""Regenerate docs/screenshot-replay.png and screenshot-replay-small.png: a regenerate shown at
once from the previous run and being verified as it is recomputed (issue 39), at 1000x700 and
then at 800x600, the debug dock open.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        .venv/bin/python docs/make_replay_screenshot.py [--model demo]

Offscreen, in a throw-away data dir, with a fixed seed. It asks one question, regenerates it,
and grabs the window while the replay is verifying: its badge reads "verified n / N" with
0 < n < N. Then it waits for the end, which must be the identical badge (the script fails
otherwise).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

QUESTION = "Write a short paragraph about why the sky is blue."


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="demo")
    p.add_argument("--out", type=Path, default=ROOT / "docs")
    args = p.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

    from shots import ready_window, settle, wait_until  # docs/shots.py, beside this script

    from app.core import ops
    from engine.types import SamplerSettings

    try:
        w, _ = ready_window(args.model, SamplerSettings(temperature=0.7, top_p=0.9, max_tokens=120, seed=5))
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    w.resize(1000, 700)
    w.debug_panel.show()
    w.composer.setPlainText(QUESTION)
    w.reply_bar.send()
    wait_until(lambda: not w.chat.generation.busy)
    ops.regenerate(w.chat, fresh=False)
    wait_until(lambda: (r := w.chat.generation.replay) is not None and 8 <= r.verified < r.total - 8 or not w.chat.generation.busy)
    if not w.chat.generation.busy:
        print("the replay ended before it could be grabbed mid-way", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    w.grab().save(str(args.out / "screenshot-replay.png"))
    # The same replay at the smallest window (the dock still open), while it is still verifying.
    w.resize(*w.MIN_SIZE)
    settle(0.4)
    if not w.chat.generation.busy:
        print("the replay ended before the small grab", file=sys.stderr)
        return 1
    w.grab().save(str(args.out / "screenshot-replay-small.png"))
    wait_until(lambda: not w.chat.generation.busy)
    badge = w.chat_view.message_widgets()[-1].identity.text()
    if "identical" not in badge:
        print(f"the replay did not end identical ({badge!r})", file=sys.stderr)
        return 1
    w.close()
    print(f"wrote screenshot-replay.png and screenshot-replay-small.png to {args.out} (ended: {badge})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
