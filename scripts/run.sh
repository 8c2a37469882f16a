#!/usr/bin/env bash
# `make run` (GUI) and `make chat` (terminal chat with the demo model).
#
#   scripts/run.sh gui  [ARGS...]    create/update .venv, then open the Verbatim window
#   scripts/run.sh chat [ARGS...]    create/update .venv, then `python -m engine chat --model demo`
#
# On Linux the GUI opens only when there is a display ($DISPLAY or $WAYLAND_DISPLAY); without one
# this prints how to run it and exits 0. OpenBLAS is preloaded on Linux when installed (it must be
# set before the interpreter starts, which is why the launcher does it and not the app).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=openblas.sh
. "$ROOT/scripts/openblas.sh"
MODE="${1:-gui}"
shift || true

"$ROOT/scripts/venv.sh" test
PY="$ROOT/.venv/bin/python"

if [ "$(uname -s)" = "Linux" ] && ! verbatim_preload_openblas; then
    echo "note: OpenBLAS not found: prefill will be ~10x slower on Linux." >&2
    verbatim_openblas_hint
fi

cd "$ROOT"
case "$MODE" in
    chat)
        case " $* " in
            *" --model "* | *" --model="*) ;;
            *) set -- --model demo "$@" ;;
        esac
        exec "$PY" -m engine chat "$@"
        ;;
    gui)
        if [ "$(uname -s)" = "Darwin" ] || [ -n "${DISPLAY:-}" ] || [ -n "${WAYLAND_DISPLAY:-}" ]; then
            exec "$PY" -m app "$@"
        fi
        cat <<'HINT'
Verbatim is installed in .venv and ready, but there is no display ($DISPLAY and
$WAYLAND_DISPLAY are unset), so the window cannot open here. Either:

  xvfb-run -a make run         the GUI on a virtual X server (apt-get install xvfb xauth
                               libxcb-icccm4 libxcb-keysyms1; see README, "Linux")
  make chat                    chat in the terminal with the built-in demo model
                               (= .venv/bin/python -m engine chat --model demo)
HINT
        exit 0
        ;;
    *)
        echo "usage: scripts/run.sh gui|chat [ARGS...]" >&2
        exit 2
        ;;
esac
