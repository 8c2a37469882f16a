"""The determinism inspector in the window (pytest-qt, offscreen, tiny real model): the compare
view on stored variants and against a cold run, the per-token view, a receipt exported by the GUI
that `python -m engine verify` accepts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtCore import QPoint, Qt  # noqa: E402

from app.qt.inspector.compare_view import columns  # noqa: E402
from app.qt.window.window import MainWindow  # noqa: E402
from tests.gui.driver import LONG, ROOT, click, replies, send, wait_compared, wait_idle  # noqa: E402

pytestmark = pytest.mark.gui


def test_compare_diverging_variants_and_a_cold_run(qtbot: Any, open_window: Callable[..., MainWindow]) -> None:
    w = open_window(max_tokens=32)
    send(qtbot, w, "Why is the sky blue?")
    first = replies(w)[-1]
    click(qtbot, w, "newVariantButton")
    wait_idle(qtbot, w)
    second = replies(w)[-1]
    assert second.badge == "new seed" and w.chat_view.widget_for(second.id).identity.property("state") == "info"
    store = w.session.store
    ta, tb = store.get_message(second.id).tokens, store.get_message(first.id).tokens
    expected = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))

    widget = w.chat_view.widget_for(second.id)
    assert widget.compare_button.isVisible()
    data = wait_compared(qtbot, w, lambda: qtbot.mouseClick(widget.compare_button, Qt.MouseButton.LeftButton))
    view = w.inspector.view
    assert view.isVisible() and data.a.message_id == second.id and data.b.message_id == first.id
    c = data.comparison
    assert c.first_diff == expected and c.shared_tokens == expected
    assert view.verdict.text() == f"diverge at token {expected}"
    assert view.prefix.text().startswith(f"shared prefix: {expected} tokens, {c.shared_chars} characters")
    assert "seed" in view.side_a.text() and "cache:" in view.side_b.text()
    # The table highlights the first divergent row; the plot holds both sides' logprobs and |delta|.
    assert view.model.rowCount() == max(len(ta), len(tb))
    assert view.table.selectionModel().selectedRows()[0].row() == expected
    assert view.model.data(view.model.index(expected, 1)).endswith(f"({ta[expected]})")
    assert view.plot.a == store.get_message(second.id).logprobs and view.plot.b == store.get_message(first.id).logprobs
    assert view.plot.deltas == [abs(x - y) for x, y in zip(view.plot.a, view.plot.b)]
    assert view.plot.first_diff == expected
    assert data.a.pieces is not None and len(data.a.pieces) == len(ta)  # token texts from the loaded model
    view.grab()  # paints

    # B = a cold run of A: exact mode reproduces it bit for bit.
    cold = wait_compared(qtbot, w, lambda: qtbot.mouseClick(view.cold_button, Qt.MouseButton.LeftButton))
    assert cold.comparison.identical and cold.b.source is None and cold.b.tokens == ta
    assert view.verdict.text() == f"identical ({len(ta)} tokens, bit-equal logprobs)"
    assert view.plot.first_diff is None and set(view.plot.deltas) == {0.0}


def test_plot_columns_stay_bounded_at_4k_tokens() -> None:
    series = [-(i % 97) / 10 for i in range(4096)]
    cols = columns(series, 600)
    assert len(cols) == 600
    assert min(lo for lo, _ in cols) == min(series) and max(hi for _, hi in cols) == max(series)
    assert columns(series[:10], 600) == [(v, v) for v in series[:10]]


def test_per_token_view_and_receipt_verified_by_the_cli(
    qtbot: Any, open_window: Callable[..., MainWindow], tmp_path: Path
) -> None:
    w = open_window(max_tokens=24)
    send(qtbot, w, "Explain how a prompt cache works in two sentences.")
    reply = replies(w)[-1]
    stored = w.session.store.get_message(reply.id)
    widget = w.chat_view.widget_for(reply.id)
    with qtbot.waitSignal(w.inspector.tokensShown, timeout=LONG):
        qtbot.mouseClick(widget.tokens_button, Qt.MouseButton.LeftButton)
    tv = widget.token_view
    assert tv.isVisible() and not widget.body.isVisible()
    assert tv.tokens == stored.tokens and tv.logprobs == stored.logprobs and len(tv.starts) == len(stored.tokens)
    tip = tv.tooltip(0)
    assert f"token {stored.tokens[0]}" in tip and f"logprob {stored.logprobs[0]:.6g}" in tip
    # Hit test: the token under its first character is that token.
    i = next(k for k, p in enumerate(tv.pieces) if p.strip())
    cursor = tv.textCursor()
    cursor.setPosition(tv.starts[i])
    rect = tv.cursorRect(cursor)
    assert tv.token_at(QPoint(rect.left() + 2, rect.center().y())) == i
    qtbot.mouseClick(widget.tokens_button, Qt.MouseButton.LeftButton)
    assert widget.body.isVisible() and not tv.isVisible()

    path = w.inspector.export_receipt(reply.id, str(tmp_path / "reply.receipt.json"))
    doc = json.loads(Path(path).read_text())
    assert doc["tokens"] == stored.tokens and doc["model"]["key"] == stored.model_key and doc["model"]["spec"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "engine", "verify", path, "--no-cache"], capture_output=True,
                          text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("OK")


# -- 2. Compare shows this comparison, and reuses Verify's cold run -------------------------------
def test_compare_never_shows_another_comparison_and_reuses_the_cold_run_verify_made(
    qtbot: Any, open_window: Callable[..., MainWindow], monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    from engine.engine import Engine
    from tests.gui.driver import wait_compared

    cold_runs: list[int] = []  # prompts run cold (on the engine thread)
    real = Engine.cold_run

    def counted(self: Engine, request: Any, cancel: Any = None) -> Any:
        result = real(self, request, cancel)
        cold_runs.append(result.report.prompt_tokens)
        return result

    monkeypatch.setattr(Engine, "cold_run", counted)
    w = open_window()
    send(qtbot, w, "Why is the sky blue? " * 8)
    earlier = wait_compared(qtbot, w, lambda: w.inspector.open_compare(replies(w)[-1].id))  # B: a cold run
    assert len(cold_runs) == 1 and w.inspector.view.data is earlier
    w.conversations.new()
    send(qtbot, w, "Hi.")
    reply = replies(w)[-1]
    w.debug_panel.show()
    qtbot.mouseClick(w.debug_panel.verify_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.chat.cold_runs.verifying, timeout=LONG)
    assert w.debug_panel.value("verify").startswith("✓ identical") and len(cold_runs) == 2
    view = w.inspector.open_compare(reply.id)
    # At once: nothing of the earlier conversation's comparison is on screen.
    assert view.data is None and view.side_a.text() == "" and view.model.rowCount() == 0
    data = wait_compared(qtbot, w, lambda: None)
    assert data.a.tokens == w.session.store.get_message(reply.id).tokens == data.b.tokens
    assert len(cold_runs) == 2  # Verify's cold run is B: not run again
    assert "cold run of" in view.side_b.text() and data.comparison.identical
