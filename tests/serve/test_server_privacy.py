"""Clients of the local server cannot read each other's prompts through the prompt cache.

The attack from issue 20: one client sends "My bank PIN is 4831...", another guesses and reads
the `verbatim` report's match counts. Each API key is its own cache namespace, keyless API clients
share one that is not the app window's, and a namespace never restores nor even matches another's
snapshots, in memory or on disk (after a restart).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from engine.cache.namespace import cache_key
from engine.serve.keys import API_NAMESPACE, KeyFileError, Keys, read_keys_file
from engine.serve.schema import APIError
from engine.types import GenerationRequest, SamplerSettings
from tests.server_helpers import TIMEOUT, Server, chat, lps, spawn_serve

SECRET = [{"role": "user", "content": "My bank PIN is 4831. Keep it safe for me."}]


def guess(pin: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"My bank PIN is {pin}. Keep it safe for me."}]


def test_two_keys_never_see_each_others_cache_in_memory_or_on_disk(tiny_model: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    guessers = {pin: f"guesser-{pin}" for pin in ("1111", "4800", "4831")}
    s = Server(tiny_model, cache, api_keys=["alice-key", "bob-key", *guessers.values()])
    try:
        alice, bob = s.client(api_key="alice-key"), s.client(api_key="bob-key")
        first = chat(alice, s.model, SECRET, logprobs=True)
        n = first.usage.prompt_tokens
        # Bob sends Alice's very prompt, then guesses: nothing cached, nothing matched, nothing said.
        same = chat(bob, s.model, SECRET, logprobs=True)
        assert same.usage.prompt_tokens_details.cached_tokens == 0
        assert same.verbatim["matched"] == 0 and same.verbatim["source"] is None
        assert same.verbatim["identical_to_previous"] is None  # not "you sent what someone else sent"
        assert same.verbatim["token_ids"] == first.verbatim["token_ids"] and lps(same) == lps(first)
        # The oracle: guesses matched 29, 31 and 37 tokens. Now each says 0.
        for pin, key in guessers.items():
            g = chat(s.client(api_key=key), s.model, guess(pin), max_tokens=2)
            assert g.verbatim["matched"] == 0 and g.usage.prompt_tokens_details.cached_tokens == 0, pin
        # Alice still gets her own prompt back from the cache.
        again = chat(alice, s.model, SECRET, logprobs=True)
        assert again.usage.prompt_tokens_details.cached_tokens == n - 1
        assert again.verbatim["identical_to_previous"] is True
    finally:
        s.close()

    # A fresh server on the same cache dir: the disk tier keeps the namespaces apart too.
    s = Server(tiny_model, cache, api_keys=["alice-key", "carol-key"])
    try:
        carol = chat(s.client(api_key="carol-key"), s.model, SECRET)
        assert carol.usage.prompt_tokens_details.cached_tokens == 0 and carol.verbatim["matched"] == 0
        alice_disk = chat(s.client(api_key="alice-key"), s.model, SECRET, logprobs=True)
        assert alice_disk.verbatim["source"] == "disk"
        assert alice_disk.usage.prompt_tokens_details.cached_tokens == n - 1
        assert alice_disk.verbatim["layer_offsets"] == [n - 1] * len(alice_disk.verbatim["layer_offsets"])
        assert alice_disk.verbatim["token_ids"] == first.verbatim["token_ids"] and lps(alice_disk) == lps(first)
    finally:
        s.close()


def test_keyless_api_clients_do_not_reach_the_windows_conversations(tiny_model: Path) -> None:
    s = Server(tiny_model, None)
    try:
        # What the app window does: generate in its own namespace (None), on the same engine.
        window = s.engine(lambda e: e.generate(GenerationRequest(SECRET, SamplerSettings(max_tokens=4))))
        assert window.report.source is None
        r = chat(s.client(), s.model, SECRET, max_tokens=4)
        assert r.usage.prompt_tokens_details.cached_tokens == 0 and r.verbatim["matched"] == 0
        assert r.verbatim["token_ids"] == window.tokens
        # ...while the window's own regenerate still restores its snapshot.
        regen = s.engine(lambda e: e.generate(GenerationRequest(SECRET, SamplerSettings(max_tokens=4))))
        assert regen.report.restored == len(regen.prompt_ids) - 1
        # With sharing on (the window's toggle), keyless clients use the window's namespace.
        s.call(_set_share(s, True))
        shared = chat(s.client(), s.model, SECRET, max_tokens=4)
        assert shared.usage.prompt_tokens_details.cached_tokens == shared.usage.prompt_tokens - 1
    finally:
        s.close()


async def _set_share(s: Server, on: bool) -> None:
    s.handle.set_share_window_cache(on)


def test_keys_and_namespaces_as_plain_functions(tmp_path: Path) -> None:
    assert Keys.of([]).namespace({}) == API_NAMESPACE
    assert Keys.of([], share_window=True).namespace({}) is None
    keys = Keys.of(["k1", "k2", "k1"])
    assert keys.keys == ("k1", "k2")
    a, b = keys.namespace({"Authorization": "Bearer k1"}), keys.namespace({"Authorization": "bearer  k2 "})
    assert a != b and a is not None and "k1" not in a
    for headers in ({}, {"Authorization": "Bearer k3"}, {"Authorization": "Basic k1"}, {"Authorization": "k1"}):
        with pytest.raises(APIError) as e:
            keys.namespace(headers)
        assert e.value.status == 401
    assert cache_key("abc", None) == "abc"
    assert cache_key("abc", a) != cache_key("abc", b) != cache_key("abc", API_NAMESPACE)
    f = tmp_path / "keys.txt"
    f.write_text("# clients\nalpha\n\n  beta  \n")
    assert read_keys_file(f) == ["alpha", "beta"]
    f.write_text("# nothing\n")
    with pytest.raises(KeyFileError):
        read_keys_file(f)
    with pytest.raises(KeyFileError):
        read_keys_file(tmp_path / "missing.txt")


def test_cli_takes_keys_from_a_file_kept_out_of_ps(tiny_model: Path, tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("# one key per line\nkey-for-alice-0123\nkey-for-bob-4567\n")
    for bad, says in ((["--api-keys-file", str(tmp_path / "missing.txt")], "cannot read"),
                      (["--allow-origin", "localhost:3000"], "origin")):
        run = subprocess.run([sys.executable, "-m", "engine", "serve", "--model", str(tiny_model), *bad],
                             capture_output=True, text=True, timeout=TIMEOUT, cwd=Path(__file__).resolve().parents[2])
        assert run.returncode == 2 and says in run.stderr, run.stderr
    p, url = spawn_serve(["--model", str(tiny_model), "--port", "0", "--chunk", "8", "--no-cache",
                     "--api-keys-file", str(keys)], {k: v for k, v in os.environ.items() if k != "VERBATIM_API_KEY"})
    try:
        cmdline = Path(f"/proc/{p.pid}/cmdline").read_bytes() if Path(f"/proc/{p.pid}").exists() else b""
        assert b"key-for-alice" not in cmdline
        with pytest.raises(openai.AuthenticationError):
            chat(openai.OpenAI(base_url=url, api_key="key-for-eve", max_retries=0, timeout=TIMEOUT), tiny_model.name)
        alice = openai.OpenAI(base_url=url, api_key="key-for-alice-0123", max_retries=0, timeout=TIMEOUT)
        bob = openai.OpenAI(base_url=url, api_key="key-for-bob-4567", max_retries=0, timeout=TIMEOUT)
        a = [chat(alice, tiny_model.name, SECRET) for _ in range(2)]
        b = chat(bob, tiny_model.name, SECRET)
        assert a[1].usage.prompt_tokens_details.cached_tokens == a[1].usage.prompt_tokens - 1
        assert b.usage.prompt_tokens_details.cached_tokens == 0 and b.verbatim["matched"] == 0
    finally:
        p.send_signal(signal.SIGINT)
        rest = p.stderr.read()
        assert p.wait(TIMEOUT) == 0, rest
