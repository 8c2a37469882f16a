#!/usr/bin/env bash
# The client libraries' own environments for the conformance suite (tests/test_agent_clients.py).
# Most run in .venv (the test extra pins them); instructor needs an openai release the main
# environment cannot hold (instructor 1.17 pins jiter<0.15, openai>=3.4 needs jiter>=0.16), so it
# gets .venv-instructor with the exact pins in tests/clients/instructor.txt. Idempotent and quiet:
# skipped when the pins and this script are unchanged since the last install (a stamp).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ENV="$ROOT/.venv-instructor"
PINS="$ROOT/tests/clients/instructor.txt"
# The base interpreter of the suite's venv (VENV, as scripts/test.sh; .venv by default): the
# client env needs nothing of the project.
VENV="${VENV:-.venv}"
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
BASE="$("$VENV/bin/python" -c 'import sys; print(sys._base_executable)')"
STAMP="$ENV/.verbatim-install-stamp"
KEY="$(cat "$PINS" "${BASH_SOURCE[0]}" | "$BASE" -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$KEY" ] && [ -x "$ENV/bin/python" ]; then
    exit 0
fi
echo "Setting up .venv-instructor (the conformance suite's instructor client)..." >&2
rm -rf "$ENV"
"$BASE" -m venv "$ENV"
LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT
if ! "$ENV/bin/python" -m pip --disable-pip-version-check -q install --no-deps -r "$PINS" >"$LOG" 2>&1; then
    cat "$LOG" >&2
    echo "error: installing $PINS into .venv-instructor failed (log above)" >&2
    exit 1
fi
echo "$KEY" >"$STAMP"
