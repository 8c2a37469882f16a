#!/usr/bin/env bash
# `make bench`: run the benchmark suite (bench/run_all.py) with OpenBLAS preloaded on Linux.
# `make bench-blas`: measure the OpenBLAS effect itself (bench/blas.py, it preloads on its own).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=openblas.sh
. "$ROOT/scripts/openblas.sh"
WHAT="${1:-all}"
shift || true

"$ROOT/scripts/venv.sh" test
cd "$ROOT"
case "$WHAT" in
    all)
        if [ ! -f "$ROOT/bench/run_all.py" ]; then
            echo "error: bench/run_all.py does not exist yet: the benchmark suite has not landed." >&2
            echo "       (the OpenBLAS measurement is available now: make bench-blas)" >&2
            exit 1
        fi
        if [ "$(uname -s)" = "Linux" ] && ! verbatim_preload_openblas; then
            echo "note: OpenBLAS not found; numbers will reflect MLX's reference BLAS." >&2
            verbatim_openblas_hint
        fi
        exec "$ROOT/.venv/bin/python" bench/run_all.py "$@"
        ;;
    blas)
        exec "$ROOT/.venv/bin/python" bench/blas.py "$@"
        ;;
    *)
        echo "usage: scripts/bench.sh all|blas [ARGS...]" >&2
        exit 2
        ;;
esac
