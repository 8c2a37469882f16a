"""`python -m engine serve --hosts a,b` / `--hostfile H`: run mlx.launch for the user.

The same server command goes to every host through mlx.launch (ring backend unless `--backend`
says otherwise), without the launch options. SIGINT/SIGTERM here reach the ranks on this
machine as SIGTERM (rank 0 then stops every rank); the launcher's exit status is returned.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

LAUNCH_OPTIONS = ("--hosts", "--hostfile", "--backend", "--ring-port")  # each takes one value


def server_argv(argv: Sequence[str]) -> list[str]:
    """The `serve` arguments without the launch options (`--opt value` and `--opt=value`)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in LAUNCH_OPTIONS:
            skip = True
        elif not a.startswith(tuple(o + "=" for o in LAUNCH_OPTIONS)):
            out.append(a)
    return out


def launcher() -> str:
    here = Path(sys.executable).parent / "mlx.launch"
    found = str(here) if here.exists() else shutil.which("mlx.launch")
    if not found:
        raise FileNotFoundError("mlx.launch is not installed next to this Python (pip install mlx)")
    return found


def launch(hosts: Optional[str], hostfile: Optional[str], backend: str, ring_port: Optional[int],
           argv: Sequence[str]) -> int:
    cmd = [launcher(), "--backend", backend, *(["--hostfile", hostfile] if hostfile else ["--hosts", hosts or ""])]
    if ring_port:
        cmd += ["--starting-port", str(ring_port)]
    cmd += ["--", sys.executable, "-m", "engine", "serve", *server_argv(argv)]
    print("running: " + " ".join(cmd), file=sys.stderr, flush=True)
    # Its own session: a Ctrl-C here must not reach mlx.launch, which dies of it (exit 254).
    proc = subprocess.Popen(cmd, start_new_session=True)

    def forward(*_: object) -> None:
        """SIGTERM to the ranks on this machine (mlx.launch's children): every rank then stops."""
        for pid in _children(proc.pid):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    return proc.wait()


def _children(pid: int) -> list[int]:
    """Direct children of `pid` (pgrep exists on macOS and Linux)."""
    try:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [int(x) for x in out.split()]
