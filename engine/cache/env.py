"""The compute environment: what, besides the model key, decides the bits of a forward (MLX and
mlx-lm versions, device, platform, BLAS). Both tiers root every block name in it (blocks.py), and
the disk tier records it in each pack and manifest: a state computed by other kernels is never
restored here (G3). Its own module so that the memory tier needs nothing of the disk package."""

from __future__ import annotations

from typing import Optional

import mlx.core as mx

from engine.blas import blas_library

MAX_ENV_LEN = 1024  # what a pack or index row may say (longer is damage: disk/format.py)

_ENV: Optional[str] = None


def compute_env() -> str:
    """What, besides the model key, decides the bits of a forward: versions, device, BLAS."""
    global _ENV
    if _ENV is None:
        import platform

        import mlx_lm

        _ENV = (f"mlx {mx.__version__}; mlx-lm {mlx_lm.__version__}; {mx.default_device()}; "
                f"{platform.system()} {platform.machine()}; blas {blas_library()}")[:MAX_ENV_LEN]
    return _ENV
