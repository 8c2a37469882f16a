#!/usr/bin/env bash
# The client environments of the conformance suite. Idempotent and quiet: each part is skipped
# when its pins and this script are unchanged since its last install (a stamp).
#
# - .venv-instructor (tests/serve/test_agent_clients.py): most client libraries run in .venv (the test
#   extra pins them); instructor needs an openai release the main environment cannot hold
#   (instructor 1.17 pins jiter<0.15, openai>=3.4 needs jiter>=0.16), so it gets a venv of its own
#   with the exact pins in tests/clients/instructor.txt.
# - .harnesses (tests/serve/test_harnesses.py): the agent harnesses, Codex CLI and Claude Code, the npm
#   packages pinned in tests/clients/harnesses/package-lock.json, installed by `npm ci` (each
#   package's own native binary). Node and npm are system dependencies, like Xvfb (.ci/run installs
#   them where missing); without npm this part is skipped with a note, and those tests skip (in CI
#   they fail).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The base interpreter of the suite's venv (VENV, as scripts/test.sh; .venv by default): the
# client envs need nothing of the project.
VENV="${VENV:-.venv}"
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
BASE="$("$VENV/bin/python" -c 'import sys; print(sys._base_executable)')"
LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT

digest() {  # the SHA-256 of the files given
    cat "$@" | "$BASE" -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())'
}

instructor_env() {
    local env="$ROOT/.venv-instructor" pins="$ROOT/tests/clients/instructor.txt"
    local stamp="$env/.verbatim-install-stamp" key
    key="$(digest "$pins" "${BASH_SOURCE[0]}")"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$key" ] && [ -x "$env/bin/python" ]; then
        return 0
    fi
    echo "Setting up .venv-instructor (the conformance suite's instructor client)..." >&2
    rm -rf "$env"
    "$BASE" -m venv "$env"
    if ! "$env/bin/python" -m pip --disable-pip-version-check -q install --no-deps -r "$pins" >"$LOG" 2>&1; then
        cat "$LOG" >&2
        echo "error: installing $pins into .venv-instructor failed (log above)" >&2
        exit 1
    fi
    echo "$key" >"$stamp"
}

harnesses() {
    local dir="$ROOT/.harnesses" pins="$ROOT/tests/clients/harnesses"
    local stamp="$dir/.verbatim-install-stamp" key
    if ! command -v npm >/dev/null 2>&1; then
        echo "note: npm not found (install Node.js 20 or newer): the agent harness tests" \
             "(tests/serve/test_harnesses.py) will skip" >&2
        return 0
    fi
    key="$(digest "$pins/package.json" "$pins/package-lock.json" "${BASH_SOURCE[0]}")"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$key" ] && [ -x "$dir/node_modules/.bin/codex" ] \
            && [ -x "$dir/node_modules/.bin/claude" ]; then
        return 0
    fi
    echo "Setting up .harnesses (Codex CLI and Claude Code for the conformance suite, ~800 MB)..." >&2
    rm -rf "$dir"
    mkdir -p "$dir"
    cp "$pins/package.json" "$pins/package-lock.json" "$dir/"
    if ! (cd "$dir" && npm_config_update_notifier=false npm ci --no-audit --no-fund --loglevel=error) >"$LOG" 2>&1 \
            || ! "$dir/node_modules/.bin/codex" --version >>"$LOG" 2>&1 \
            || ! "$dir/node_modules/.bin/claude" --version >>"$LOG" 2>&1; then
        cat "$LOG" >&2
        echo "error: installing the agent harnesses ($pins) into .harnesses failed (log above)" >&2
        exit 1
    fi
    echo "$key" >"$stamp"
}

instructor_env
harnesses
