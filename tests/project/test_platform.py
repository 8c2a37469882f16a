"""What differs between the two platforms the suite runs on: MLX's CPU backend on Linux (with
OpenBLAS preloaded by `make test`), Metal on a Mac (the CI's macOS job); the keyring backend a
Mac app gets; and the packaged self-check (packaging/briefcase/verbatim), which the release
workflow runs inside the built app: the demo model loads, answers, and regenerates identically."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest

from engine.blas import blas_library, optimized_blas
from tests.engine_helpers import make_engine
from tests.tiny_models import build_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.linux_only
def test_linux_runs_mlx_on_the_cpu_and_make_test_preloads_openblas() -> None:
    assert mx.default_device() == mx.cpu  # the determinism tests' backend, the dequantize rule's too
    if os.environ.get("VERBATIM_REQUIRE_OPENBLAS") == "1":  # CI (.ci/run)
        assert "openblas" in blas_library().lower() and "LD_PRELOAD" in os.environ


@pytest.mark.mac_only
def test_a_mac_runs_mlx_on_metal_with_accelerate_and_no_preload() -> None:
    assert mx.metal.is_available() and mx.default_device() == mx.gpu
    assert blas_library().startswith("Accelerate.framework/") and optimized_blas()
    assert "blas" not in os.environ.get("DYLD_INSERT_LIBRARIES", "").lower()  # scripts/openblas.sh: Linux only


@pytest.mark.mac_only
def test_on_metal_4bit_weights_stay_packed(tmp_path: Path) -> None:
    """engine._should_dequantize expands 4-bit weights only on the CPU backend."""
    folder = build_model(tmp_path / "q4", "llama", quantize_bits=4)
    eng = make_engine(folder)
    assert eng.info is not None and eng.info.dequantized is False


@pytest.mark.mac_only
def test_the_mac_keyring_is_the_keychain_and_the_dialog_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    import keyring
    from keyring.backends import macOS

    from app.core.engine_link import api_keys

    assert macOS.Keyring.viable  # what keyring picks on a Mac (nothing is written to it here)
    monkeypatch.setattr(keyring, "get_keyring", lambda: macOS.Keyring())
    assert api_keys.remember_label() == "Remember the key (kept in the macOS Keychain)"


@pytest.mark.slow
def test_the_packaged_self_check_answers_with_the_demo_and_regenerates_identically() -> None:
    """`python -m verbatim --self-check --require-demo`, as the release runs it in the .app."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "packaging" / "briefcase"), str(ROOT)])}
    proc = subprocess.run([sys.executable, "-m", "verbatim", "--self-check", "--require-demo"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    line = next(x for x in out.splitlines() if x.startswith("ok   demo reply + identical regenerate:"))
    device = "gpu" if sys.platform == "darwin" else "cpu"
    assert "8 tokens, regenerate identical with " in line and f"on Device({device}, 0)" in line, line
    assert out.rstrip().endswith("verbatim self-check: all passed")
