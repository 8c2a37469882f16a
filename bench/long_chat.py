"""Opening a long conversation in the real window: time and memory, with the chat view building
only the messages near the viewport (app/qt/conversation/chat_view.py, VIRTUALIZE) and, side by
side in the same process, building every message's widget (what it did before); then the
time of one scroll step (a wheel's worth, 120 px) through the conversation.

    .venv/bin/python bench/long_chat.py [--sizes 40 400 2000 10000] [--old-max 2000]

Conversations are written straight into the store (alternating user / assistant messages of
varied length, some with code blocks). Each size is opened in a fresh window on the test
suite's tiny model; RSS is read from /proc after the open, less the window's RSS before it.
Sizes over --old-max are not opened with virtualization off (minutes, gigabytes).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def text(i: int) -> str:
    """A message of varied length; every 7th reply has a code block."""
    words = " ".join(f"word{(i * 7 + k) % 97}" for k in range(10 + (i * 37) % 140))
    if i % 14 == 1:
        return f"{words}\n\n```python\ndef f{i}(x):\n    return x * {i}\n```\n"
    return words


def write_conversation(data_dir: Path, n: int) -> int:
    from app.core.store import open_app_store

    store, lock = open_app_store(data_dir)
    conv = store.create_conversation(f"{n} messages")
    parent = None
    for i in range(n):
        parent = store.add_message(conv.id, parent, "user" if i % 2 == 0 else "assistant", text(i)).id
    store.close()
    if lock is not None:
        lock.release()
    return conv.id


def open_once(model: Path, n: int, virtualize: bool, app) -> dict:
    from PySide6.QtCore import QEvent, QPoint, QPointF, Qt
    from PySide6.QtGui import QWheelEvent

    from app import build_main_window
    from app.qt.conversation import chat_view

    chat_view.VIRTUALIZE = virtualize
    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "data"
        conv = write_conversation(data, n)
        w = build_main_window(str(model), data)
        w.resize(1200, 800)
        w.show()
        while not w.chat.link.ready:
            app.processEvents()
        w.conversations.show(None)
        app.processEvents()
        gc.collect()
        before = rss_mb()
        t0 = time.perf_counter()
        w.conversations.show(conv)
        app.processEvents()
        opened = time.perf_counter() - t0
        built = len(w.chat_view.widgets)
        gc.collect()
        grown = rss_mb() - before
        # Scroll steps: wheel events from the bottom upwards, each one processed fully.
        view = w.chat_view
        steps = []
        for _ in range(60):
            ev = QWheelEvent(QPointF(50, 50), QPointF(50, 50), QPoint(0, 0), QPoint(0, 120),
                             Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier,
                             Qt.ScrollPhase.NoScrollPhase, False)
            t = time.perf_counter()
            app.sendEvent(view.viewport(), ev)
            app.processEvents()
            steps.append(time.perf_counter() - t)
        assert QEvent  # imported for the wheel event's types
        w.close()
        app.processEvents()
    steps.sort()
    return {"open_s": opened, "rss_mb": grown, "built": built,
            "step_median_ms": 1000 * steps[len(steps) // 2], "step_max_ms": 1000 * steps[-1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[40, 400, 2000, 10000])
    ap.add_argument("--old-max", type=int, default=2000, help="largest size opened with every widget built")
    args = ap.parse_args()
    from PySide6.QtWidgets import QApplication

    from tests.tiny_models import build_model

    app = QApplication.instance() or QApplication([])
    with tempfile.TemporaryDirectory() as d:
        model = build_model(Path(d) / "llama", family="llama")
        rows = []
        for n in args.sizes:
            new = open_once(model, n, True, app)
            old = open_once(model, n, False, app) if n <= args.old_max else None
            rows.append((n, new, old))
            print(n, new, old, flush=True)
    base = rows[0][1]["open_s"]
    print("\n| messages | open, every widget (s) | open, near the viewport (s) | new / new at "
          f"{rows[0][0]} | RSS +MB every / near | widgets built every / near | scroll step median / max (ms) near |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n, new, old in rows:
        o = f"{old['open_s']:.2f}" if old else "not run"
        orss = f"{old['rss_mb']:.0f}" if old else "–"
        ob = f"{old['built']}" if old else "–"
        print(f"| {n:,} | {o} | {new['open_s']:.2f} | {new['open_s'] / base:.1f}x | {orss} / {new['rss_mb']:.0f} "
              f"| {ob} / {new['built']} | {new['step_median_ms']:.1f} / {new['step_max_ms']:.1f} |")


if __name__ == "__main__":
    main()
