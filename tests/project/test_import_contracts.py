"""The import contracts in pyproject.toml hold: engine never imports app, Qt or SQLite; the app's
core never imports Qt; the engine's layers only import downwards; no import cycles."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(exe), "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_import_contracts_are_kept() -> None:
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "5 kept, 0 broken" in out.stdout


def test_a_forbidden_import_breaks_a_contract(tmp_path: Path) -> None:
    """The contracts can fail: engine code that imports the app is reported."""
    for name in ("engine", "app"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    paths = tmp_path / "engine" / "paths.py"
    paths.write_text(paths.read_text() + "\nimport app.core.session  # noqa\n")
    out = _lint(tmp_path)
    assert out.returncode != 0
    assert "engine is pure inference: no app, no Qt, no SQLite BROKEN" in out.stdout
