"""`python -m engine serve --hosts a,b` / `--hostfile H`: run mlx.launch for the user.

The same server command goes to every host through mlx.launch (ring backend unless `--backend`
says otherwise), without the launch options. SIGINT/SIGTERM here reach the ranks on this
machine as SIGTERM (rank 0 then stops every rank). mlx.launch itself exits 0 whatever its
ranks did, so its output is passed through and read (`RankExits`): the exit status is 0 only
when every rank said it stopped cleanly ("[rank R/N] stopped"), else the launcher's own
non-zero status, else 3 (EXIT_GROUP_FAILED), so a supervisor sees a rank that crashed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Callable, Optional, Sequence

from engine.distributed.group import EXIT_GROUP_FAILED

LAUNCH_OPTIONS = ("--hosts", "--hostfile", "--backend", "--ring-port")  # each takes one value
STOPPED = re.compile(r"\[rank (\d+)/(\d+)\] stopped(?::|\s*$)")  # serve.py's last line of a clean stop


class RankExits:
    """Which ranks said they stopped cleanly, read from the ranks' output as it passes."""

    def __init__(self) -> None:
        self.size = 0
        self.stopped: set[int] = set()

    def feed(self, line: str) -> None:
        m = STOPPED.search(line)
        if m:
            self.stopped.add(int(m.group(1)))
            self.size = int(m.group(2))

    def status(self, launcher_rc: int) -> int:
        """The wrapper's exit status: the launcher's if it failed, 3 unless every rank stopped cleanly."""
        if launcher_rc != 0:
            return launcher_rc
        if self.size == 0 or self.stopped != set(range(self.size)):
            missing = sorted(set(range(self.size)) - self.stopped) if self.size else "every"
            print(f"error: rank(s) {missing} did not stop cleanly (crashed or killed)", file=sys.stderr, flush=True)
            return EXIT_GROUP_FAILED
        return 0


def _relay(src: IO[bytes], dst: IO[str], exits: RankExits, on_serving: Callable[[], None]) -> None:
    for raw in iter(src.readline, b""):
        line = raw.decode(errors="replace")
        exits.feed(line)
        if "Verbatim server:" in line:
            on_serving()
        dst.write(line)
        dst.flush()


def _quiet_launcher(stdin: Optional[IO[bytes]]) -> None:
    """Stop mlx.launch (0.32) spinning while the ranks idle: each of its per-rank relay threads
    select()s on that rank's stdin pipe for writing, always ready. The ranks have closed their
    stdin (serve.py), so one byte sent to mlx.launch, which it passes on to every rank, fails
    with EPIPE there and it stops watching those pipes (local ranks only: a remote one's stdin
    is its ssh). The pipe to mlx.launch stays open, so its own loop keeps waiting on it."""
    if stdin is None:
        return
    try:
        stdin.write(b"\n")
        stdin.flush()
    except OSError:
        pass


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
    proc = subprocess.Popen(cmd, start_new_session=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    exits = RankExits()
    relays = [threading.Thread(target=_relay, args=(src, dst, exits, lambda: _quiet_launcher(proc.stdin)),
                               daemon=True)
              for src, dst in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr))]
    for t in relays:
        t.start()

    def forward(*_: object) -> None:
        """SIGTERM to the ranks on this machine (mlx.launch's children): every rank then stops."""
        for pid in _children(proc.pid):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    rc = proc.wait()
    for t in relays:
        t.join(30)  # the rest of the ranks' output (their last lines say how they stopped)
    return exits.status(rc)


def _children(pid: int) -> list[int]:
    """Direct children of `pid` (pgrep exists on macOS and Linux)."""
    try:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [int(x) for x in out.split()]
