"""Regenerate docs/screenshot-{main,debug,small,models,settings,debug-live}.png from a real session
with a real model (small: the smallest size the window allows, with the debug dock open; settings:
the settings dialog with the app's memory; debug-live: the debug panel during a long prefill).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \
        .venv/bin/python docs/make_screenshots.py [--model demo] [--theme light] [--scale 1.5]

Runs offscreen (no display needed; fonts come from fontconfig), in a throw-away data dir, with
a fixed seed so the conversation is the same every time on the same model. It asks questions,
streams the replies, regenerates the last one (which must come back identical: the script fails
otherwise), opens the debug panel on that reply, the model manager and the settings, and grabs
each view; last, it asks a long follow-up and grabs the debug panel while the prompt is read (the
run in progress: what was restored, the prefill so far), then stops it.
Takes a minute or two on a CPU with the demo model (OpenBLAS preloaded on Linux).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SIDE_CHATS = [
    "Name three planets in our solar system.",
    "What are the three primary colors?",
]
LONG_TEXT = " ".join(["Light from the sun reaches the air, and the short blue waves scatter off its molecules "
                      "far more than the long red ones, so the sky looks blue by day and red at dusk."] * 24)
MAIN_CHAT = [
    "What is photosynthesis? Answer in one sentence.",
    "Write a Python function that checks whether a number is prime.",
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="demo")
    p.add_argument("--theme", default="light", choices=["light", "dark"])
    p.add_argument("--scale", default="1", help="device pixel ratio of the images (QT_SCALE_FACTOR)")
    p.add_argument("--out", type=Path, default=ROOT / "docs")
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ["QT_SCALE_FACTOR"] = args.scale

    from PySide6.QtWidgets import QApplication
    from shots import settle, wait_until  # docs/shots.py, beside this script

    from app import build_main_window
    from app.core import ops
    from app.core.store import ChatSettings
    from app.qt.main import ensure_application
    from engine.types import SamplerSettings

    ensure_application()

    data = Path(tempfile.mkdtemp(prefix="verbatim-shots-"))
    w = build_main_window(args.model, data, theme=args.theme)
    w.resize(1280, 820)
    errors: list[str] = []
    finished: list = []  # each reply's FinishedReply (pending, result, saved)
    w.chat.notices.error_raised.connect(lambda title, text: errors.append(text))
    w.chat.generation.finished.connect(finished.append)
    wait_until(lambda: w.chat.link.ready or bool(errors))
    if not w.chat.link.ready:
        print(f"cannot load {args.model}: {errors[-1]}", file=sys.stderr)
        return 1
    w.settings.apply(
        ChatSettings(
            sampler=SamplerSettings(temperature=0.3, top_p=0.9, repetition_penalty=1.1, max_tokens=300, seed=args.seed),
            random_seed=False,
        )
    )

    def ask(text: str) -> None:
        w.composer.setPlainText(text)
        w.reply_bar.send()
        wait_until(lambda: not w.chat.generation.busy)
        if errors:
            raise RuntimeError(errors[-1])

    for q in SIDE_CHATS:
        w.conversations.new()
        ask(q)
    w.conversations.new()
    for q in MAIN_CHAT:
        ask(q)
    first = w.chat.conversation.vms[-1]
    ops.regenerate(w.chat, fresh=False)
    wait_until(lambda: not w.chat.generation.busy)
    again = w.chat.conversation.vms[-1]  # identical: no copy added, the same reply stays selected
    outcome = finished[-1].saved.outcome
    if outcome.comparison is None or not outcome.comparison.identical or again.id != first.id:
        print("regenerate was not identical: refusing to take screenshots of that", file=sys.stderr)
        return 1
    w.chat.conversation.select(again.id)
    w.chat_view.scroll_to_bottom()
    settle()
    args.out.mkdir(parents=True, exist_ok=True)
    w.grab().save(str(args.out / "screenshot-main.png"))

    w.resize(1560, 1080)
    w.debug_panel.show()
    w.debug_panel.verifyRequested.emit(again.id)
    wait_until(lambda: not w.chat.cold_runs.verifying)
    w.chat_view.scroll_to_bottom()
    settle()
    w.grab().save(str(args.out / "screenshot-debug.png"))
    w.resize(*w.MIN_SIZE)  # the smallest size the window allows, the dock still open
    w.chat_view.scroll_to_bottom()
    settle(0.6)
    w.grab().save(str(args.out / "screenshot-small.png"))
    w.debug_panel.hide()

    w.resize(1280, 820)
    dlg = w.models.open_manager()
    wait_until(lambda: "found" in dlg.status.text() or "No models" in dlg.status.text())
    dlg.resize(820, 380)
    # This machine is offline: show what a failed download looks like (one clear line).
    dlg.download("mlx-community/SmolLM2-360M-Instruct")
    wait_until(lambda: "Download" in dlg.status.text() and dlg.cancel_button.isHidden())
    settle()
    dlg.grab().save(str(args.out / "screenshot-models.png"))
    dlg.close()

    from app.qt.conversation.settings_dialog import SettingsDialog

    link = w.chat.link
    settings = SettingsDialog(w.chat.conversation.settings(), w, link.template_system, link.memory_budget,
                              link.memory_report)
    settings.show()
    settle()
    settings.grab().save(str(args.out / "screenshot-settings.png"))
    settings.close()

    # The debug panel while a long follow-up's prompt is read: the restore, then the prefill so far.
    w.resize(1560, 1080)
    w.debug_panel.show()
    w.composer.setPlainText("Summarise this in one sentence: " + LONG_TEXT)
    w.reply_bar.send()

    def reading() -> bool:  # the prefill under way, past what was restored
        live = w.chat.generation.live
        return live is not None and live.phase == "prefilling" and live.done > live.restore.report.restored

    wait_until(lambda: reading() or not w.chat.generation.busy)
    settle()
    w.grab().save(str(args.out / "screenshot-debug-live.png"))
    ops.stop(w.chat)
    wait_until(lambda: not w.chat.generation.busy)
    w.close()
    shots = ("main", "debug", "small", "models", "settings", "debug-live")
    print(f"wrote {', '.join(f'screenshot-{n}.png' for n in shots)} to {args.out}")
    QApplication.processEvents()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
