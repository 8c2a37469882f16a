"""CLI subcommands for models: `models`, `import FILE.gguf`, `download ORG/NAME`.

`engine/cli/main.py` calls `add_subcommands(subparsers)`; each subcommand sets `func(args) -> int`.
Results go to stdout (a folder path, or the model list), progress to stderr, and a user error
is one line on stderr with exit status 1, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from engine.errors import Cancelled, GGUFError, ModelError


def _progress(quiet: bool) -> Any:
    last = [""]

    def report(fraction: float, message: str) -> None:
        line = f"{fraction * 100:5.1f}% {message}"
        if not quiet and line != last[0]:
            last[0] = line
            print(line, file=sys.stderr, flush=True)

    return report


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1


def cmd_models(args: argparse.Namespace) -> int:
    from engine.models.resolve import discover_models

    entries = discover_models(args.dir or ())
    if args.json:
        print(json.dumps([e.to_dict() for e in entries], indent=2))
        return 0
    if not entries:
        print("no models found (try: python -m engine import FILE.gguf, or --dir FOLDER)", file=sys.stderr)
        return 0
    rows = [(e.name, e.family, e.quantization, str(e.context_length or "?"), f"{e.size_bytes / 1e6:.0f} MB",
             e.source, str(e.path)) for e in entries]
    header = ("NAME", "FAMILY", "QUANT", "CONTEXT", "SIZE", "SOURCE", "PATH")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    for r in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from engine.models.resolve import resolve_model

    if not args.file.lower().endswith(".gguf"):
        return _fail(f"{args.file} is not a .gguf file")
    try:
        folder = resolve_model(args.file, progress=_progress(args.quiet))
    except (ModelError, GGUFError, Cancelled) as e:
        return _fail(str(e))
    print(folder)
    return 0


def cmd_download(args: argparse.Namespace) -> int:
    from engine.models.download import download_model

    try:
        folder = download_model(args.repo, progress=_progress(args.quiet), revision=args.revision)
    except (ModelError, Cancelled) as e:
        return _fail(str(e))
    print(folder)
    return 0


def add_subcommands(subparsers: Any) -> None:
    """Register `models`, `import` and `download` on an argparse subparsers object."""
    p = subparsers.add_parser("models", help="list usable models (demo, imported GGUFs, HF cache, folders)")
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.add_argument("--dir", action="append", metavar="FOLDER", help="also look in FOLDER (repeatable)")
    p.set_defaults(func=cmd_models)

    p = subparsers.add_parser("import", help="convert a .gguf file into an MLX model folder (cached)")
    p.add_argument("file", metavar="FILE.gguf")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_import)

    p = subparsers.add_parser("download", help="download an MLX model repo from the Hugging Face hub")
    p.add_argument("repo", metavar="ORG/NAME")
    p.add_argument("--revision", default=None)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_download)


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (the main CLI normally mounts these subcommands itself)."""
    parser = argparse.ArgumentParser(prog="python -m engine.cli.models")
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
