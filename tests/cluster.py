"""A Verbatim server on N ranks on localhost (ring backend, CPU), for the multi-rank tests.

`Cluster.start()` spawns one `python -m engine serve` per rank with the environment mlx.launch
would give it (MLX_RANK, MLX_HOSTFILE: free loopback ports), or runs mlx.launch itself
(`launcher=True`). Every wait has a deadline; `close()` kills whatever still runs.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 120.0  # seconds: a safety net for every wait, never a pass condition


def free_ports(n: int) -> list[int]:
    """`n` consecutive free loopback ports (mlx.launch numbers the ring ports from a start)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65535:
            continue
        socks = []
        try:
            for p in range(base, base + n):
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", p))
            return list(range(base, base + n))
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise RuntimeError("no free ports")


@contextmanager
def running(model: str, size: int, tmp: Path, *args: str, **kw: Any) -> Iterator["Cluster"]:
    """A started cluster (cache and logs under `tmp`), killed on the way out whatever happened."""
    cluster = Cluster(model, size, tmp / "server-cache", tmp / "logs", *args, **kw)
    try:
        yield cluster.start()
    finally:
        cluster.close()


class Cluster:
    def __init__(self, model: str, size: int, cache_dir: Path, logs: Path, *args: str, launcher: bool = False,
                 threads: int = 1) -> None:
        self.model, self.size, self.cache_dir, self.logs = model, size, cache_dir, logs
        self.args, self.launcher, self.threads = list(args), launcher, threads
        self.procs: list[subprocess.Popen] = []
        self.port = 0
        self.runs = 0

    # -- life --------------------------------------------------------------------------------
    def start(self, same_port: bool = False) -> "Cluster":
        """Start every rank (`same_port`: the HTTP port of the previous start, for a client that
        should find the server where it was)."""
        self.runs += 1
        self.logs.mkdir(parents=True, exist_ok=True)
        ring = free_ports(self.size)
        if not (same_port and self.port):
            self.port = free_ports(1)[0]
        serve = [sys.executable, "-m", "engine", "serve", "--model", self.model, "--port", str(self.port),
                 "--cache-dir", str(self.cache_dir), *self.args]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(self.threads),
               "OPENBLAS_NUM_THREADS": str(self.threads)}
        if self.launcher:
            cmd = [str(Path(sys.executable).parent / "mlx.launch"), "-n", str(self.size), "--backend", "ring",
                   "--starting-port", str(ring[0]), "--", *serve]
            self.procs = [self._popen(cmd, env, "launch")]
        else:
            hostfile = self.logs / f"hosts-{self.runs}.json"
            hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in ring]))
            self.procs = [self._popen(serve, {**env, "MLX_RANK": str(r), "MLX_HOSTFILE": str(hostfile)}, f"rank{r}")
                          for r in range(self.size)]
        self.wait_ready()
        return self

    def _popen(self, cmd: list[str], env: dict[str, str], name: str) -> subprocess.Popen:
        log = open(self.logs / f"{name}-{self.runs}.log", "w")
        # A new session: killing the group in close() reaches what mlx.launch started too.
        return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def log(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()}" for p in sorted(self.logs.glob(f"*-{self.runs}.log")))

    def wait_ready(self) -> None:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                raise AssertionError(f"a rank exited while starting:\n{self.log()}")
            try:
                self.get("/verbatim/status", timeout=2)
                return
            except urllib.error.HTTPError:  # it answers (e.g. 401: started with --api-key)
                return
            except OSError:
                time.sleep(0.2)  # polling for the port to open (a deadline above, not a pass condition)
        raise AssertionError(f"the cluster did not start within {TIMEOUT} s:\n{self.log()}")

    def stop(self, sig: int = signal.SIGTERM, rank: int = 0) -> list[Optional[int]]:
        """Signal one rank (rank 0: the server) and wait for every process to exit; their codes."""
        os.kill(self.rank_pids()[rank], sig)
        return self.wait_exit()

    def wait_exit(self, timeout: float = TIMEOUT) -> list[Optional[int]]:
        deadline = time.monotonic() + timeout
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        return codes

    def rank_pids(self) -> dict[int, int]:
        """rank -> pid of the engine process (also under mlx.launch)."""
        if not self.launcher:
            return {r: p.pid for r, p in enumerate(self.procs)}
        out = {}
        for d in Path("/proc").iterdir():
            try:
                env = (d / "environ").read_bytes().split(b"\0")
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if b"engine\0serve" in cmd and f"--port\0{self.port}\0".encode() in cmd:
                for e in env:
                    if e.startswith(b"MLX_RANK="):
                        out[int(e[9:])] = int(d.name)
        return out

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(30)

    # -- HTTP ------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, timeout: float = TIMEOUT) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            return json.loads(r.read())

    def chat(self, messages: list[dict[str, str]], **body: Any) -> dict[str, Any]:
        data = json.dumps({"model": "", "messages": messages, "temperature": 0, "seed": 0, "logprobs": True,
                           "max_tokens": 8, **body}).encode()
        req = urllib.request.Request(self.url + "/v1/chat/completions", data,
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise AssertionError(f"HTTP {e.code}: {e.read().decode()}") from e

    def stream(self, messages: list[dict[str, str]], timeout: float, **body: Any) -> Iterator[dict[str, Any]]:
        """The server-sent events of a streamed chat, as JSON objects."""
        data = json.dumps({"model": "", "messages": messages, "temperature": 0, "seed": 0, "stream": True,
                           **body}).encode()
        req = urllib.request.Request(self.url + "/v1/chat/completions", data, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            for line in r:
                if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                    yield json.loads(line[6:])


def logprobs(resp: dict[str, Any]) -> list[float]:
    return [e["logprob"] for e in resp["choices"][0]["logprobs"]["content"]]
