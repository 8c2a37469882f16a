"""Regenerate docs/screenshot-continue.png and docs/screenshot-continue-small.png: a reply that
ended at max tokens, continued (issue 39), with the debug panel open.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \
        .venv/bin/python docs/make_continue_screenshot.py [--model demo]

Offscreen, in a throw-away data dir, with a fixed seed. It asks one question with a small max
tokens, so the reply ends there. Then it continues it with the reply's own seed and settings, and
checks the continued reply against a run that was never cut: the same question with the larger
max tokens, whose tokens must equal the cut reply plus its continuation (the script fails
otherwise). It grabs the window at 1000x700 and at 800x600, the dock open both times.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

QUESTION = "Explain in a few sentences why the sky is blue."
CUT_AT = 24


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="demo")
    p.add_argument("--out", type=Path, default=ROOT / "docs")
    args = p.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

    from shots import ready_window, settle, wait_until  # docs/shots.py, beside this script

    from app.core import ops
    from engine.types import GenerationRequest, SamplerSettings

    try:
        w, errors = ready_window(args.model, SamplerSettings(temperature=0.7, top_p=0.9, max_tokens=CUT_AT, seed=11))
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    w.resize(1000, 700)
    w.debug_panel.show()
    w.composer.setPlainText(QUESTION)
    w.reply_bar.send()
    wait_until(lambda: not w.chat.generation.busy)
    reply = w.chat.conversation.vms[-1]
    if not reply.continuable:
        print(f"the reply did not end at max tokens ({reply.status}): nothing to continue", file=sys.stderr)
        return 1
    if not ops.continue_reply(w.chat, reply.id):
        print("Continue was refused", file=sys.stderr)
        return 1
    wait_until(lambda: not w.chat.generation.busy)
    if errors:
        print(errors[-1], file=sys.stderr)
        return 1
    continued = w.chat.conversation.vms[-1]
    # The reply that was never cut: the same request, twice the max tokens, no cache.
    messages = [{"role": "user", "content": QUESTION}]
    full = w.chat.jobs.executor.submit(lambda e: e.generate(GenerationRequest(
        messages, SamplerSettings(temperature=0.7, top_p=0.9, max_tokens=2 * CUT_AT, seed=11), use_cache=False))
    ).result(600)
    if continued.content != full.text[: len(continued.content)] or not continued.content.startswith(reply.content):
        print("the continued reply differs from the reply that was never cut: no screenshot of that",
              file=sys.stderr)
        return 1
    w.chat.conversation.select(continued.id)
    w.chat_view.scroll_to_bottom()
    args.out.mkdir(parents=True, exist_ok=True)
    settle(0.5)
    w.grab().save(str(args.out / "screenshot-continue.png"))
    w.resize(*w.MIN_SIZE)
    w.chat_view.scroll_to_bottom()
    settle(0.5)
    w.grab().save(str(args.out / "screenshot-continue-small.png"))
    w.close()
    print(f"wrote screenshot-continue.png, screenshot-continue-small.png to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
