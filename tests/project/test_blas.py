"""engine.blas names the BLAS MLX's sgemm binds to; the OpenBLAS gate of the determinism tests
(tests/engine_helpers.require_openblas) reads it, so every optimized library must be recognised."""

from __future__ import annotations

import pytest

from engine import blas


@pytest.mark.parametrize(
    "path, name, optimized",
    [
        ("/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3", "openblas-pthread/libblas.so.3", True),
        ("/System/Library/Frameworks/Accelerate.framework/Versions/A/Frameworks/vecLib.framework/Versions/A/libBLAS.dylib",
         "Accelerate.framework/libBLAS.dylib", True),
        ("/System/Library/Frameworks/vecLib.framework/Versions/A/libBLAS.dylib", "Accelerate.framework/libBLAS.dylib", True),
        ("/opt/venv/lib/python3.11/site-packages/mlx/lib/libmlx.so", "lib/libmlx.so", False),
    ],
)
def test_blas_library_names_accelerate_and_openblas(
    monkeypatch: pytest.MonkeyPatch, path: str, name: str, optimized: bool
) -> None:
    assert blas.describe(path) == name
    monkeypatch.setattr(blas, "blas_library", lambda: blas.describe(path))
    assert blas.optimized_blas() is optimized
