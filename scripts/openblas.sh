# Sourced by the other scripts: find an optimized BLAS to preload on Linux.
#
# MLX's Linux CPU wheel links a reference BLAS (~4 GFLOP/s on f32 matmul). Preloading OpenBLAS
# (Debian: `apt-get install libopenblas0-pthread`) makes f32 prefill about 10x faster, and the
# engine's determinism tests need it (see README "Linux: OpenBLAS"). macOS uses Metal: no-op.
#
#   VERBATIM_OPENBLAS=/path/libblas.so   use this library
#   VERBATIM_NO_OPENBLAS=1               never preload (to compare, or to debug)

verbatim_find_openblas() {
    [ "$(uname -s)" = "Linux" ] || return 1
    [ "${VERBATIM_NO_OPENBLAS:-0}" = "1" ] && return 1
    local lib arch
    arch="$(uname -m)"
    for lib in \
        "${VERBATIM_OPENBLAS:-}" \
        "/usr/lib/${arch}-linux-gnu/openblas-pthread/libblas.so.3" \
        "/usr/lib/${arch}-linux-gnu/openblas-openmp/libblas.so.3" \
        "/usr/lib64/libopenblasp.so.0" \
        "/usr/lib64/libopenblas.so.0" \
        "/usr/lib/libopenblas.so.0"; do
        if [ -n "$lib" ] && [ -f "$lib" ]; then
            echo "$lib"
            return 0
        fi
    done
    return 1
}

# Export LD_PRELOAD with OpenBLAS when found. Returns 1 (and changes nothing) when not found.
verbatim_preload_openblas() {
    local lib
    lib="$(verbatim_find_openblas)" || return 1
    case ":${LD_PRELOAD:-}:" in
        *":$lib:"*) ;;
        *) export LD_PRELOAD="$lib${LD_PRELOAD:+:$LD_PRELOAD}" ;;
    esac
    return 0
}

verbatim_openblas_hint() {
    echo "  Debian/Ubuntu: sudo apt-get install libopenblas0-pthread   (then run this again)" >&2
}
