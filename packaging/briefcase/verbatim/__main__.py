"""Entry point that briefcase runs: `python -m verbatim` inside the bundle / dev environment."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--read-document"]:  # a document reader process (engine/documents/bounded.py)
        from engine.documents.child import main as read_document

        return read_document()
    if "--self-check" in argv:
        from verbatim.selfcheck import run

        return run(require_demo="--require-demo" in argv)
    from app.qt.main import main as app_main

    sys.argv = [sys.argv[0], *argv]
    result = app_main(argv)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
