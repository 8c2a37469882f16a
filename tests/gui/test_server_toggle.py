"""The window's "Local server" toggle: the loaded model served through the window's own worker.

Runs the window on a qasync loop as the app does; the `openai` client runs on a plain thread
and is awaited from the loop, so the window keeps processing events meanwhile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import openai
import pytest

from app import build_main_window
from app.qt import jobs
from engine.types import GenerationRequest, SamplerSettings

pytestmark = pytest.mark.gui
TIMEOUT = 120
MSGS = [{"role": "user", "content": "Why is the sky blue?"}]


def test_toggle_serves_the_loaded_model_while_the_window_stays_responsive(
    qtbot: Any, tiny_model: Path, tmp_path: Path
) -> None:
    import qasync
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    w = build_main_window(str(tiny_model), tmp_path / "data", chunk=8)
    qtbot.addWidget(w)
    qtbot.waitUntil(lambda: w.chat.link.ready, timeout=TIMEOUT * 1000)
    toggle = w.models.server_toggle
    toggle.port = 0  # any free port
    app = QApplication.instance()
    quits = app.quitOnLastWindowClosed()
    app.setQuitOnLastWindowClosed(False)  # closing the window must not end the loop under the test
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    pool = concurrent.futures.ThreadPoolExecutor(2)

    def ask(url: str, **kw: Any) -> Any:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=TIMEOUT)
        return client.chat.completions.create(model=toggle.model.id, messages=MSGS, temperature=0, seed=0,
                                              max_tokens=8, logprobs=True, **kw)

    async def until(pred: Any) -> None:
        """Await a server state change that makes `pred(state)` true."""
        hit = asyncio.Event()
        unsub = toggle.handle.state.subscribe(lambda st: hit.set() if pred(st) else None)
        try:
            if not pred(toggle.handle.state):
                await asyncio.wait_for(hit.wait(), TIMEOUT)
        finally:
            unsub()

    async def body() -> None:
        assert not toggle.label.isVisible()
        toggle.action.trigger()  # on
        await asyncio.wait_for(toggle.wait_stopped(), TIMEOUT)
        url = toggle.url
        assert url is not None and toggle.action.isChecked() and url in toggle.label.text()

        # The reply is the engine's own: the same tokens as the window's worker gives directly.
        expected = await asyncio.wrap_future(w.chat.jobs.executor.submit(lambda e: e.generate(GenerationRequest(
            MSGS, SamplerSettings(max_tokens=8, seed=0), use_cache=False)).tokens))
        first = await asyncio.wait_for(asyncio.wrap_future(pool.submit(ask, url)), TIMEOUT)
        assert first.verbatim["token_ids"] == expected

        # Hold the worker: a request queues behind it, visibly, and the window keeps handling
        # events while it waits (the GUI thread never waits on MLX or on the server).
        release = threading.Event()
        w.chat.jobs.executor.submit(lambda e: release.wait(TIMEOUT))
        pending = pool.submit(ask, url)
        await until(lambda st: st.waiting == 1)
        assert "1 request" in toggle.label.text()
        ticked = loop.create_future()
        QTimer.singleShot(0, lambda: ticked.set_result(True))
        assert await asyncio.wait_for(ticked, TIMEOUT) and not pending.done()
        release.set()
        second = await asyncio.wait_for(asyncio.wrap_future(pending), TIMEOUT)
        assert second.verbatim["token_ids"] == expected
        assert [t.logprob for t in second.choices[0].logprobs.content] == \
            [t.logprob for t in first.choices[0].logprobs.content]
        assert second.usage.prompt_tokens_details.cached_tokens == second.usage.prompt_tokens - 1
        await until(lambda st: st.waiting == 0 and st.running == 0)

        # Off, then on again, then the window closes: each time the port is freed.
        toggle.action.trigger()
        await asyncio.wait_for(toggle.wait_stopped(), TIMEOUT)
        assert toggle.url is None and not toggle.label.isVisible()
        _assert_closed(url)
        toggle.action.trigger()
        await asyncio.wait_for(toggle.wait_stopped(), TIMEOUT)
        url = toggle.url
        assert url is not None
        w.close()
        await asyncio.wait_for(toggle.wait_stopped(), TIMEOUT)
        _assert_closed(url)

    try:
        _run(loop, body(), pool, w)
    finally:
        app.setQuitOnLastWindowClosed(quits)


def _run(loop: Any, coro: Any, pool: concurrent.futures.ThreadPoolExecutor, w: Any) -> None:
    """Run a test's body on its qasync loop, then stop the pool, the window and the loop."""
    try:
        loop.run_until_complete(coro)
    finally:
        pool.shutdown(wait=True)
        w.shutdown()
        asyncio.set_event_loop(jobs.gui_loop())  # the app's loop again: the tests after this one run on it
        loop.close()


def _assert_closed(url: str) -> None:
    u = urlparse(url)
    with pytest.raises(OSError):
        socket.create_connection((u.hostname, u.port), timeout=5).close()


def test_api_clients_reach_the_windows_conversation_only_when_sharing_is_on(
    qtbot: Any, tiny_model: Path, tmp_path: Path
) -> None:
    """The window's own conversation (sent through its composer) is not restored, nor matched, by an
    API client sending the very same text, until "Share this window's cache" is turned on."""
    import qasync
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QApplication, QPushButton

    secret = "My bank PIN is 4831. Keep it safe for me."
    w = build_main_window(str(tiny_model), tmp_path / "data", chunk=8)
    qtbot.addWidget(w)
    qtbot.waitUntil(lambda: w.chat.link.ready, timeout=TIMEOUT * 1000)
    w.composer.setPlainText(secret)
    qtbot.mouseClick(w.findChild(QPushButton, "sendButton"), Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.chat.generation.busy, timeout=TIMEOUT * 1000)
    toggle = w.models.server_toggle
    toggle.port = 0
    share = toggle.share_action
    assert share.objectName() == "shareCacheAction" and not share.isChecked()  # off by default
    assert "can neither reuse nor detect" in share.toolTip()
    app = QApplication.instance()
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    pool = concurrent.futures.ThreadPoolExecutor(1)

    def ask(url: str) -> Any:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=TIMEOUT)
        return client.chat.completions.create(model=toggle.model.id, messages=[{"role": "user", "content": secret}],
                                              temperature=0, max_tokens=4)

    async def body() -> None:
        toggle.action.trigger()  # the server on, sharing off
        await asyncio.wait_for(toggle.wait_stopped(), TIMEOUT)
        url = toggle.url
        assert url is not None
        private = await asyncio.wait_for(asyncio.wrap_future(pool.submit(ask, url)), TIMEOUT)
        assert private.usage.prompt_tokens_details.cached_tokens == 0
        assert private.verbatim["matched"] == 0 and private.verbatim["source"] is None
        share.trigger()  # on, while the server runs
        assert toggle.handle.share_window_cache
        shared = await asyncio.wait_for(asyncio.wrap_future(pool.submit(ask, url)), TIMEOUT)
        n = shared.usage.prompt_tokens
        assert shared.verbatim["matched"] >= n - 1 and shared.usage.prompt_tokens_details.cached_tokens == n - 1
        toggle.action.trigger()
        await asyncio.wait_for(toggle.wait_stopped(), TIMEOUT)

    _run(loop, body(), pool, w)


def test_the_local_server_starts_as_engine_serve_would_with_the_settings_seed_and_the_templates_options(
    qtbot: Any, tmp_path: Path
) -> None:
    """The toggle's server gives a request that names no seed the seed the settings give every new
    reply (`engine serve --seed`), and passes on the request options the loaded model's chat
    template reads (`template_reads`: reasoning_effort here), as `engine serve` does."""
    import json
    import urllib.request

    import qasync
    from PySide6.QtWidgets import QApplication

    from app.core.store import ChatSettings
    from tests.tiny_models import OPTIONS_TEMPLATE, build_templated_model

    model = build_templated_model(tmp_path / "reads", OPTIONS_TEMPLATE)  # its chat template reads reasoning_effort
    w = build_main_window(str(model), tmp_path / "data", chunk=8)
    qtbot.addWidget(w)
    qtbot.waitUntil(lambda: w.chat.link.ready, timeout=TIMEOUT * 1000)
    w.settings.apply(ChatSettings(sampler=SamplerSettings(max_tokens=2, seed=1234), random_seed=False))
    toggle = w.models.server_toggle
    toggle.port = 0
    app = QApplication.instance()
    quits = app.quitOnLastWindowClosed()
    app.setQuitOnLastWindowClosed(False)
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    pool = concurrent.futures.ThreadPoolExecutor(1)

    def ask(url: str) -> dict[str, Any]:
        body = {"messages": MSGS, "max_tokens": 2, "reasoning_effort": "high"}  # no seed
        req = urllib.request.Request(url + "/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
            return dict(json.loads(r.read()))

    async def body() -> None:
        assert toggle.model is not None and toggle.model.template_reads == ("reasoning_effort",)
        toggle.action.trigger()
        await asyncio.wait_for(toggle.wait_stopped(), TIMEOUT)
        assert toggle.url is not None
        out = await asyncio.wait_for(asyncio.wrap_future(pool.submit(ask, toggle.url)), TIMEOUT)
        assert out["verbatim"]["seed"] == 1234 and out["verbatim"]["ignored"] == []
        toggle.action.trigger()
        await asyncio.wait_for(toggle.wait_stopped(), TIMEOUT)

    try:
        _run(loop, body(), pool, w)
    finally:
        app.setQuitOnLastWindowClosed(quits)
