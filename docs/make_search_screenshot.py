"""Regenerate docs/screenshot-search-800x600.png and docs/screenshot-search-1000x700.png: a
search hit in the conversation already open, scrolled to and marked (issue 39), the word marked
in the sidebar's snippet and in the message, with the debug dock open.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        .venv/bin/python docs/make_search_screenshot.py [--model demo]

Offscreen, in a throw-away data dir, with a fixed seed. It asks about Vienna's river, then a few
long questions that push that turn out of view, searches "danube" and clicks the hit; at each
size it checks the hit is in view and its word marked (the script fails otherwise), then grabs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FIRST = "Which river flows through Vienna? I think it is the Danube."
FILLERS = [
    "Tell me about the history of mapmaking, from clay tablets to satellite images, in a few lines. " * 3,
    "Explain how a bridge carries its load, arch by arch and cable by cable, in plain words. " * 3,
    "What makes bread rise, and why does sourdough taste sour? Keep it short and friendly. " * 3,
]
SIZES = [(800, 600), (1000, 700)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="demo")
    p.add_argument("--out", type=Path, default=ROOT / "docs")
    args = p.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

    from PySide6.QtCore import QPoint, QRect, Qt
    from PySide6.QtTest import QTest

    from shots import ready_window, settle, wait_until  # docs/shots.py, beside this script

    from app.qt.conversation.sidebar import MARKED_ROLE
    from engine.types import SamplerSettings

    try:
        w, _ = ready_window(args.model, SamplerSettings(temperature=0.7, top_p=0.9, max_tokens=40, seed=5))
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    w.show()
    w.debug_panel.show()
    for text in [FIRST, *FILLERS]:
        w.composer.setPlainText(text)
        w.reply_bar.send()
        wait_until(lambda: not w.chat.generation.busy)
    hit_id = w.chat.conversation.vms[0].id
    args.out.mkdir(parents=True, exist_ok=True)
    for width, height in SIZES:
        w.resize(width, height)
        w.composer.setPlainText("")  # the next action: an earlier mark goes
        w.sidebar.search.setText("")
        settle()
        w.chat_view.scroll_to_bottom()
        settle()
        w.sidebar.search.setText("danube")
        wait_until(lambda: w.sidebar.list.count() == 1 and bool(w.sidebar.list.item(0).data(MARKED_ROLE)))
        settle()
        item = w.sidebar.list.item(0)
        QTest.mouseClick(w.sidebar.list.viewport(), Qt.MouseButton.LeftButton, pos=w.sidebar.list.visualItemRect(item).center())
        wait_until(lambda: w.chat_view.following is None)
        settle(0.5)
        target, vp = w.chat_view.widget_for(hit_id), w.chat_view.viewport()
        shown = target is not None and vp.rect().intersects(QRect(target.mapTo(vp, QPoint(0, 0)), target.size()))
        if not shown or target.body.marked() != ["Danube"]:
            print(f"{width}x{height}: the hit is not in view and marked", file=sys.stderr)
            return 1
        name = f"screenshot-search-{width}x{height}.png"
        w.grab().save(str(args.out / name))
        print(f"wrote {name} to {args.out}")
    w.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
