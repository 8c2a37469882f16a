#!/usr/bin/env bash
# `make test`: create/update .venv, then run the whole pytest suite (extra args go to pytest).
# VENV=folder runs it in another venv than .venv (scripts/venv.sh), e.g. one for another Python.
# On Linux, OpenBLAS is preloaded when installed; with VERBATIM_REQUIRE_OPENBLAS=1 (CI) a
# missing OpenBLAS is an error. Exit status is pytest's, except "no tests collected" (5),
# which is reported and treated as success while the suite is being written.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=openblas.sh
. "$ROOT/scripts/openblas.sh"

"$ROOT/scripts/venv.sh" test
# instructor's own small environment for the conformance suite (tests/serve/test_agent_clients.py).
"$ROOT/scripts/client_envs.sh"
VENV="${VENV:-.venv}"
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac

if [ "$(uname -s)" = "Linux" ] && ! verbatim_preload_openblas; then
    if [ "${VERBATIM_REQUIRE_OPENBLAS:-0}" = "1" ]; then
        echo "error: VERBATIM_REQUIRE_OPENBLAS=1 but no OpenBLAS library was found." >&2
        verbatim_openblas_hint
        exit 1
    fi
    echo "note: OpenBLAS not found; MLX uses its slow reference BLAS and the determinism" >&2
    echo "      tests that need an optimized BLAS will skip." >&2
    verbatim_openblas_hint
fi

cd "$ROOT"
set +e
"$VENV/bin/python" -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "make test: pytest collected no tests (exit 5); nothing failed." >&2
    exit 0
fi
exit "$rc"
