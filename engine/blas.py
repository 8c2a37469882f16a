"""Which BLAS MLX's CPU backend actually uses (it decides speed, and low bits of f32 results)."""

from __future__ import annotations

import os

import mlx.core as mx

OPTIMIZED = ("openblas", "mkl", "blis", "accelerate")


def blas_library() -> str:
    """The library MLX's `cblas_sgemm` binds to, as `<dir>/<file>` (e.g. a preloaded OpenBLAS).

    Asked of the dynamic linker: a preloaded library wins in the global scope, else libmlx's own
    dependency. (Scanning /proc/self/maps for "openblas" is wrong: numpy maps its own copy.)
    """
    import ctypes
    import glob

    class DlInfo(ctypes.Structure):
        _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                    ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]

    try:
        dladdr = ctypes.CDLL(None).dladdr
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
        handles = [ctypes.CDLL(None)]
        handles += [ctypes.CDLL(p) for p in glob.glob(os.path.join(os.path.dirname(mx.__file__), "lib", "libmlx.*"))]
        for h in handles:
            for sym in ("cblas_sgemm", "sgemm_"):
                fn = getattr(h, sym, None)
                info = DlInfo()
                if fn is not None and dladdr(ctypes.cast(fn, ctypes.c_void_p), ctypes.byref(info)) and info.fname:
                    return describe(os.path.realpath(info.fname.decode(errors="replace")))
    except (OSError, AttributeError):
        pass
    return "unknown"


def describe(path: str) -> str:
    """A library path as `<dir>/<file>`; macOS's Accelerate (its BLAS is
    `.../Accelerate.framework/.../vecLib.framework/Versions/A/libBLAS.dylib`, where the last two
    parts would say only "A/libBLAS.dylib") as `Accelerate.framework/<file>`."""
    parts = path.split("/")
    if any(p in ("Accelerate.framework", "vecLib.framework") for p in parts):
        return f"Accelerate.framework/{parts[-1]}"
    return "/".join(parts[-2:])


def optimized_blas() -> bool:
    """True if MLX's sgemm resolves to an optimized BLAS (e.g. a preloaded OpenBLAS)."""
    lib = blas_library().lower()
    return any(name in lib for name in OPTIMIZED)
