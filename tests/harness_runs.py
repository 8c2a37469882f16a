"""Agent harnesses run headless against `python -m engine serve`: Codex CLI (`codex exec`, a custom
`model_providers` entry with `wire_api = "responses"`) and Claude Code (`claude -p`,
`ANTHROPIC_BASE_URL` and the `ANTHROPIC_DEFAULT_*_MODEL` variables), as their own documentation
sets them up. Used by tests/serve/test_harnesses.py and bench/harness_prefix.py.

Both are the npm packages pinned in tests/clients/harnesses/package-lock.json, installed by
scripts/client_envs.sh into .harnesses/ (Node is a system dependency, like Xvfb). Each run gets a
home and a working folder of its own (nothing of the user's), every address points at 127.0.0.1,
and each harness's own settings turn off its telemetry, update checks and other traffic: nothing
leaves the machine (the tests run where only loopback is reachable).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
HARNESSES = ROOT / ".harnesses"
BIN = HARNESSES / "node_modules" / ".bin"
PINS = ROOT / "tests" / "clients" / "harnesses" / "package.json"
RECORDED = ROOT / "tests" / "clients" / "harnesses"  # each harness's first request, recorded once
TIMEOUT = 600.0  # seconds for one harness turn: only reached when something hangs
KINDS = ("codex", "claude")
# The request fields that name a session, not the conversation (a fresh one per session): left out
# when two sessions' requests are compared.
SESSION_FIELDS = {"codex": ("prompt_cache_key", "client_metadata"), "claude": ("metadata",)}


def version(kind: str) -> str:
    """The pinned version of a harness (tests/clients/harnesses/package.json)."""
    deps = json.loads(PINS.read_text())["dependencies"]
    return deps["@openai/codex" if kind == "codex" else "@anthropic-ai/claude-code"]


def installed(kind: str) -> bool:
    return (BIN / kind).exists()


@dataclass
class Served:
    """`python -m engine serve` on an ephemeral loopback port."""

    process: subprocess.Popen
    url: str  # http://127.0.0.1:PORT/v1
    startup: list[str]  # what it wrote to stderr before listening (the model load, the read-ahead)

    @property
    def base(self) -> str:
        return self.url[: -len("/v1")]

    def stop(self) -> str:
        """SIGTERM; what it wrote to stderr after starting (it must exit 0)."""
        self.process.terminate()
        rest = self.process.stderr.read() if self.process.stderr else ""
        code = self.process.wait(TIMEOUT)
        assert code == 0, f"engine serve exited {code}: {rest[-2000:]}"
        return rest


def serve(model: Path, cache_dir: Path, seed: int, context: int, chunk: int = 512,
          extra: tuple[str, ...] = ()) -> Served:
    """Start the server and return once it says where it listens (its stderr stays open)."""
    p = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--model", str(model), "--port", "0",
                          "--cache-dir", str(cache_dir), "--chunk", str(chunk), "--seed", str(seed),
                          "--context-length", str(context), *extra],
                         stderr=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ})
    assert p.stderr is not None
    lines = []
    for line in p.stderr:  # ends at EOF if the server dies
        if line.startswith("Verbatim server:") and " at http" in line:
            return Served(p, line.split(" at ", 1)[1].split()[0], lines)
        lines.append(line)
    p.wait(TIMEOUT)
    raise AssertionError(f"engine serve did not start (rc {p.returncode})")


@dataclass
class Session:
    """One harness turn: the command, its environment and where it runs."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    answer: Path  # where the harness writes its final message (Codex) or its JSON result (Claude Code)


def session(kind: str, base_url: str, model: str, home: Path, work: Path, prompt: str) -> Session:
    """A headless turn of `kind` against `base_url` (http://127.0.0.1:PORT, no /v1), in `work`,
    with `home` as its home (its settings and state live there)."""
    home.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8",
           "TMPDIR": str(home), "NO_COLOR": "1", "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    answer = home / f"answer-{kind}"
    if kind == "codex":
        codex_home = home / ".codex"
        codex_home.mkdir(exist_ok=True)
        # A custom provider speaking the Responses API; no update check, analytics or feedback.
        (codex_home / "config.toml").write_text(
            f'model = "{model}"\n'
            'model_provider = "verbatim"\n'
            "check_for_update_on_startup = false\n"
            "[model_providers.verbatim]\n"
            'name = "Verbatim"\n'
            f'base_url = "{base_url}/v1"\n'
            'wire_api = "responses"\n'
            "[analytics]\nenabled = false\n"
            "[feedback]\nenabled = false\n")
        env["CODEX_HOME"] = str(codex_home)
        argv = [str(BIN / "codex"), "exec", "--skip-git-repo-check", "--ephemeral", "--sandbox", "read-only",
                "--color", "never", "--output-last-message", str(answer), prompt]
    else:
        # Claude Code's gateway setup: its base URL, a key, every model alias the served model,
        # and none of its nonessential traffic (telemetry, error reports, update checks).
        env.update({"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": "sk-unused", "ANTHROPIC_MODEL": model,
                    "ANTHROPIC_DEFAULT_SONNET_MODEL": model, "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
                    "ANTHROPIC_DEFAULT_HAIKU_MODEL": model, "ANTHROPIC_SMALL_FAST_MODEL": model,
                    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
                    "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1",
                    "CLAUDE_CONFIG_DIR": str(home / ".claude")})
        argv = [str(BIN / "claude"), "-p", prompt, "--output-format", "json"]
    return Session(argv, env, work, answer)


def run(s: Session, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    """Run the turn (stdin closed); its output for the caller to check."""
    p = subprocess.run(s.argv, cwd=s.cwd, env=s.env, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    if s.argv[0].endswith("claude"):
        s.answer.write_text(p.stdout)
    return p


def conversation(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """A request body without what names its session (SESSION_FIELDS, and Codex's per-session item
    ids): two sessions that send the same conversation compare equal."""
    out = {k: v for k, v in body.items() if k not in SESSION_FIELDS[kind]}
    if kind == "codex" and isinstance(out.get("input"), list):
        out["input"] = [{k: v for k, v in item.items() if k != "id"} if isinstance(item, dict) else item
                        for item in out["input"]]
    return out


def recorded(kind: str) -> dict[str, Any]:
    """The harness's first request as recorded through the test proxy: {path, body, harness}."""
    return json.loads((RECORDED / f"{kind}-first-request.json").read_text())


def replace_prompt(kind: str, body: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    """`body` with the user's prompt `old` (its own text part) replaced by `new`: another session
    of the same harness, asking something else."""
    text = json.dumps(body)
    needle = json.dumps(old)
    assert text.count(needle) == 1, f"the prompt {old!r} is not one text part of the {kind} request"
    return json.loads(text.replace(needle, json.dumps(new)))


def reply_text(kind: str, s: Session) -> Optional[str]:
    """The final message of a finished turn, as the harness reported it."""
    if not s.answer.exists():
        return None
    if kind == "codex":
        return s.answer.read_text()
    result = json.loads(s.answer.read_text())
    return result.get("result") if result.get("subtype") == "success" and not result.get("is_error") else None
