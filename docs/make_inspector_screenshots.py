"""Regenerate docs/screenshot-compare.png and docs/screenshot-tokens.png (the determinism inspector).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \
        .venv/bin/python docs/make_inspector_screenshots.py [--model demo]

Offscreen, in a throw-away data dir: asks one question, makes a new variant (another seed),
opens the compare view on the two and the per-token view of the first, and grabs both.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
QUESTION = "What is photosynthesis? Answer in two sentences."


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="demo")
    p.add_argument("--out", type=Path, default=ROOT / "docs")
    args = p.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


    from shots import ready_window, wait_until  # docs/shots.py, beside this script

    from app.core import ops
    from app.qt.main import ensure_application
    from engine.types import SamplerSettings

    app = ensure_application()

    try:
        w, _ = ready_window(args.model, SamplerSettings(temperature=0.7, top_p=0.95, max_tokens=120, seed=7))
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    w.resize(1100, 760)
    w.composer.setPlainText(QUESTION)
    w.reply_bar.send()
    wait_until(lambda: not w.chat.generation.busy)
    first = [vm for vm in w.chat.conversation.vms if vm.role == "assistant"][-1]
    ops.regenerate(w.chat, fresh=True)
    wait_until(lambda: not w.chat.generation.busy)
    second = [vm for vm in w.chat.conversation.vms if vm.role == "assistant"][-1]
    view = w.inspector.open_compare(second.id, first.id)
    view.resize(1000, 700)
    wait_until(lambda: w.inspector.last is not None)
    args.out.mkdir(parents=True, exist_ok=True)
    view.grab().save(str(args.out / "screenshot-compare.png"))
    view.close()

    ops.switch_variant(w.chat, first.id)
    shown: list[int] = []
    w.inspector.tokensShown.connect(shown.append)
    widget = w.chat_view.widget_for(first.id)
    widget.tokens_button.setChecked(True)
    wait_until(lambda: bool(shown))
    app.processEvents()
    widget.grab().save(str(args.out / "screenshot-tokens.png"))
    w.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
