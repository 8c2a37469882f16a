"""The reader process of bounded.py: `python -m engine.documents.child`.

Reads one file from stdin (a JSON header line: name, kind, size, chars, memory; then the file's
bytes) and answers on stdout, one JSON object a line: {"t": "step"} as the reader makes progress
(a PDF page, 64 KiB of XML), then {"t": "done", "text", "pages", "unread"} or {"t": "error",
"why"}. Its memory is capped here where the system enforces it (RLIMIT_AS on Linux); the parent
also watches its resident size and clock, and kills it past either.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def main() -> int:
    out = sys.stdout.buffer

    def send(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj).encode() + b"\n")
        out.flush()

    header = json.loads(sys.stdin.buffer.readline())
    memory = int(header["memory"])
    _cap_memory(memory)
    data = sys.stdin.buffer.read(int(header["size"]))
    from engine.documents.extract import DocumentError, read_raw

    try:
        got = read_raw(str(header["kind"]), str(header["name"]), data, int(header["chars"]),
                       tick=lambda: send({"t": "step"}))
        send({"t": "done", "text": got.text, "pages": got.pages, "unread": list(got.unread)})
    except DocumentError as e:
        send({"t": "error", "why": e.why})
    except MemoryError:
        send({"t": "error", "why": f"needs more than {memory >> 20:,} MiB of memory to read: refused"})
    except Exception as e:  # a reader's own failure on a broken file: said, not a traceback
        send({"t": "error", "why": f"cannot be read ({type(e).__name__}: {str(e)[:200]})"})
    return 0


def _cap_memory(limit: int) -> None:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):  # not enforced here (macOS): the parent's watch still is
        pass


if __name__ == "__main__":
    sys.exit(main())
