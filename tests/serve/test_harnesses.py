"""Agent harnesses, unchanged, against `python -m engine serve` (issue 47): Codex CLI (`codex exec`,
the Responses API) and Claude Code (`claude -p`, Anthropic's Messages API), as installed from npm
(tests/clients/harnesses/, scripts/client_envs.sh) and set up as their own documentation says
(tests/harness_runs.py), on a tiny random-weight tool model with a long context
(tests/tiny_models.py: build_harness_model), served with `--seed`, through the recording proxy
(tests/recording_proxy.py). Loopback only: each harness's telemetry and update checks are off.

Each harness completes a headless turn twice in the same folder: the two runs send the same
requests (but for the ids that name a session) and get byte-identical replies (but for the clock
and the cache's report), every request of the second run restored from the cache but its last
token. Then a new session asks something else: it restores at least the harness's system turn
(its system prompt and tools, thousands of tokens) and prefills only what follows; so does one
after the server restarts (it reads every client's kept states at start).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests import harness_runs as H
from tests.recording_proxy import Exchange, RecordingProxy
from tests.tiny_models import HARNESS_CONTEXT, build_harness_model

SEED = 7
PROMPT = "Say hello."
OTHER = "Name three rivers."


def _need(kind: str) -> None:
    if H.installed(kind):
        return
    msg = f"{kind} is not installed in .harnesses/ (scripts/client_envs.sh installs it; it needs Node and npm)"
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_harness_model(tmp_path_factory.mktemp("models") / "harness")


@pytest.fixture(scope="module")
def served(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[H.Served]:
    srv = H.serve(model, tmp_path_factory.mktemp("harness-cache"), seed=SEED, context=HARNESS_CONTEXT)
    yield srv
    srv.stop()


def verbatim(x: Exchange) -> dict[str, Any]:
    """The reply's `verbatim` report (a Responses stream's completed response carries it, a
    Messages stream its message_delta)."""
    for e in reversed(x.events()):
        for holder in (e, e.get("response"), e.get("message")):
            if isinstance(holder, dict) and isinstance(holder.get("verbatim"), dict):
                return holder["verbatim"]
    raise AssertionError(f"no verbatim report in {x.path}: {x.response[-400:]!r}")


def turn(kind: str, proxy: RecordingProxy, root: Path, prompt: str) -> tuple[str, list[Exchange]]:
    """One headless turn; its final message and the exchanges it made."""
    mark = proxy.mark()
    s = H.session(kind, proxy.url.removesuffix("/v1"), "harness", root / "home", root / "work", prompt)
    p = H.run(s)
    assert p.returncode == 0, f"{kind} exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    text = H.reply_text(kind, s)
    assert text, f"{kind} finished with no final message:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    exchanges = proxy.since(mark, path_suffix=None)
    assert exchanges and all(x.status == 200 for x in exchanges), [(x.path, x.status, x.response[:300])
                                                                   for x in exchanges]
    return text, exchanges


@pytest.mark.parametrize("kind", H.KINDS)
def test_a_harness_runs_a_turn_twice_identically_and_a_new_session_restores_its_system_turn(
        served: H.Served, kind: str, tmp_path: Path) -> None:
    _need(kind)
    proxy = RecordingProxy(served.base)
    try:
        first_text, first = turn(kind, proxy, tmp_path, PROMPT)
        second_text, second = turn(kind, proxy, tmp_path, PROMPT)
        _, other = turn(kind, proxy, tmp_path, OTHER)
    finally:
        proxy.close()
    path = "/v1/responses" if kind == "codex" else "/v1/messages"
    assert all(x.path.split("?")[0] == path for x in first + second + other)
    assert second_text == first_text
    assert len(second) == len(first)
    for a, b in zip(first, second):
        # The same request (its session's ids aside), the same reply byte for byte (the clock and
        # the cache's figures aside), the whole prompt but its last token from the cache.
        assert H.conversation(kind, b.request_json()) == H.conversation(kind, a.request_json())
        assert b.stable() == a.stable()
        va, vb = verbatim(a), verbatim(b)
        assert va["seed"] == vb["seed"] == SEED and va["token_ids"] == vb["token_ids"]
        assert vb["restored"] == vb["prompt_tokens"] - 1 and vb["source"] == "memory"
    cold = verbatim(first[0])
    assert cold["restored"] == 0 and cold["prompt_tokens"] > 10_000  # the harness's prompt: thousands of tokens
    # Another session: the system prompt and tools (the first message) come from the cache; what
    # follows the new question is prefilled (Claude Code's environment section comes after it).
    v = verbatim(other[0])
    system_end = v["message_starts"][0]
    assert system_end > 10_000 and v["restored"] >= system_end and v["source"] == "memory"
    assert v["prefill_tokens"] == v["prompt_tokens"] - v["restored"]


def test_after_a_restart_a_new_session_restores_the_system_turn_read_ahead(model: Path, tmp_path: Path) -> None:
    """`engine serve` reads every client's kept states at start (the keyless clients' namespace
    too): after a restart, a new Claude Code session restores at least its system turn (system
    prompt and tools) and prefills only what follows."""
    _need("claude")
    cache = tmp_path / "cache"
    srv = H.serve(model, cache, seed=SEED, context=HARNESS_CONTEXT)
    try:
        proxy = RecordingProxy(srv.base)
        try:
            turn("claude", proxy, tmp_path, PROMPT)
        finally:
            proxy.close()
    finally:
        srv.stop()
    srv = H.serve(model, cache, seed=SEED, context=HARNESS_CONTEXT)
    try:
        assert any(line.startswith("read 1 kept states") for line in srv.startup), srv.startup
        proxy = RecordingProxy(srv.base)
        try:
            _, exchanges = turn("claude", proxy, tmp_path, OTHER)
        finally:
            proxy.close()
    finally:
        srv.stop()
    v = verbatim(exchanges[0])
    # From the disk's states (read ahead, or the last session's end where it matches further: its
    # system-reminder before the question is the same), at least the system turn.
    assert v["restored"] >= v["message_starts"][0] > 10_000 and v["source"] == "disk"
    assert v["prefill_tokens"] == v["prompt_tokens"] - v["restored"]
