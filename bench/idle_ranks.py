"""CPU used by idle ranks: `mlx.launch -n 2 --backend ring -- python -m engine serve` on this machine.

    PYTHONPATH=. .venv/bin/python bench/idle_ranks.py [--seconds S] [--wrapper]   # OpenBLAS preloaded

A tiny random-weight llama (tests/tiny_models.py), one chat request (so the ranks have run a
generation), then each process's CPU time (utime + stime from /proc) over an idle window of S
seconds (default 20): each rank's share of one core, and mlx.launch's own. `--wrapper`: through
`python -m engine serve --hosts 127.0.0.1,127.0.0.1` instead (which quiets mlx.launch's relay,
engine/distributed/launch.py), the wrapper measured too. Issue 29 asks for idle ranks at <= 2%
of a core each. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.cluster import Cluster, free_ports  # noqa: E402
from tests.tiny_models import build_model  # noqa: E402


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrapped(model: Path, tmp: Path) -> tuple[subprocess.Popen, Cluster]:
    """`python -m engine serve --hosts 127.0.0.1,127.0.0.1`, started and serving."""
    ring, http = free_ports(2), free_ports(1)[0]
    p = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--model", str(model), "--port", str(http),
                          "--cache-dir", str(tmp / "cache"), "--hosts", "127.0.0.1,127.0.0.1",
                          "--ring-port", str(ring[0])], cwd=ROOT, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
    assert p.stderr is not None
    for line in p.stderr:
        if "Verbatim server:" in line:
            break
    threading.Thread(target=p.stderr.read, daemon=True).start()  # keep its pipe drained
    c = Cluster(str(model), 2, tmp / "cache", tmp / "logs", launcher=True)
    c.port = http
    return p, c


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--wrapper", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp) / "llama", family="llama")
        if args.wrapper:
            proc, c = wrapped(model, Path(tmp))
        else:
            c = Cluster(str(model), 2, Path(tmp) / "cache", Path(tmp) / "logs", launcher=True)
            c.start()
            proc = c.procs[0]
        try:
            c.chat([{"role": "user", "content": "Why is the sky blue?"}], max_tokens=4)
            pids = {f"rank {r}": p for r, p in sorted(c.rank_pids().items())}
            if args.wrapper:
                pids["serve --hosts"] = proc.pid
                launcher = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout
                pids["mlx.launch"] = int(launcher.split()[0])
            else:
                pids["mlx.launch"] = proc.pid
            before = {k: cpu_seconds(p) for k, p in pids.items()}
            t0 = time.monotonic()
            time.sleep(args.seconds)  # the idle window being measured
            dt = time.monotonic() - t0
            after = {k: cpu_seconds(p) for k, p in pids.items()}
        finally:
            if args.wrapper:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
            else:
                c.close()
    print(f"idle for {dt:.1f} s after one request; share of one core:")
    for k in pids:
        print(f"  {k:14s} {100 * (after[k] - before[k]) / dt:5.1f} %")


if __name__ == "__main__":
    main()
