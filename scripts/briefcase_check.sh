#!/usr/bin/env bash
# `make briefcase-check`: exercise the [tool.briefcase] configuration with briefcase itself.
#
# `briefcase dev` parses and finalizes the config (app name, bundle, sources, icon, license,
# PEP 621 requires/test_requires), builds its own isolated environment under .briefcase/ from
# `requires` + `test_requires` ONLY (so a dependency missing from pyproject shows up here even
# when .venv happens to have it), then runs the app module with PYTHONPATH = the `sources`
# list: `python -m verbatim --self-check` imports every app/engine module, runs an MLX op,
# loads the window icon from resources/ in a QApplication (offscreen without a display).
# Creating/building a bundle needs macOS (see packaging/README.md); this is what Linux can do.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

"$ROOT/scripts/venv.sh" test
if [ ! -x "$ROOT/.venv/bin/briefcase" ]; then
    echo "Installing briefcase into .venv..." >&2
    "$ROOT/.venv/bin/python" -m pip --disable-pip-version-check -q install -c "$ROOT/constraints.txt" -e "$ROOT[test,packaging]"
fi
# briefcase installs `requires` with pip: the same exact versions as .venv (constraints.txt).
export PIP_CONSTRAINT="$ROOT/constraints.txt"

LOG="$ROOT/build/briefcase-check.log"
mkdir -p "$(dirname "$LOG")"
# -r: rebuild the isolated environment from the current requirements every time.
if "$ROOT/.venv/bin/briefcase" dev --no-input -r -- --self-check >"$LOG" 2>&1; then
    sed -n '/^=\{20,\}/,$p' "$LOG" | tail -n +2
    echo "briefcase dev: configuration OK (full log: ${LOG#"$ROOT"/})"
else
    rc=$?
    cat "$LOG" >&2
    echo "error: briefcase dev failed (exit $rc)" >&2
    exit "$rc"
fi
