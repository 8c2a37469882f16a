"""The soak tests, for longer: the real window's session rounds (tests/gui/soak_window.py) for
--minutes, then --requests through one `engine serve` process (tests/soak_server.py), printing
None's reference count, RSS, threads, open files and widgets after every round / every --every
requests, and the growth after warm-up at the end. --engine-turns: a chat with the engine alone
(exact mode), printing each turn's RSS and where the memory is (Engine.memory_report), and
whether RSS levels off once the prompt cache's memory tier is full.

    .venv/bin/python bench/soak.py --minutes 10 --requests 20000      # (offscreen Qt)
    .venv/bin/python bench/soak.py --minutes 0 --requests 5000        # the server only
    .venv/bin/python bench/soak.py --minutes 0 --requests 0 --engine-turns 14 --engine-model demo \
        --memory-budget-mib 128                                       # the engine alone

The test suite runs the same rounds a dozen times (tests/gui/test_soak_window.py) and 2,000 requests
(tests/serve/test_soak_server.py) with bounds; this prints the curve, to see whether memory levels off.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def window(model: Path, data: Path, minutes: float, reply_tokens: int) -> None:
    from PySide6.QtCore import QCoreApplication, QDeadlineTimer
    from PySide6.QtWidgets import QApplication

    from app import build_main_window
    from app.core.store import ChatSettings
    from engine.types import SamplerSettings
    from tests.soak_probes import sample
    from tests.gui.soak_window import WindowSoak

    app = QApplication.instance() or QApplication([])

    def wait(cond, ms: int) -> None:  # the event loop turns until `cond` holds (a stuck step fails)
        deadline = QDeadlineTimer(ms)
        while not cond():
            if deadline.hasExpired():
                raise TimeoutError("a soak step did not finish")
            QCoreApplication.processEvents()

    w = build_main_window(str(model), data, chunk=16)
    w.show()
    wait(lambda: w.chat.link.ready, 120_000)
    w.settings.apply(ChatSettings(sampler=SamplerSettings(temperature=0.9, top_p=0.95, max_tokens=reply_tokens,
                                                          seed=7), random_seed=False))
    soak = WindowSoak(w, wait)
    end, i, first = time.monotonic() + 60 * minutes, 0, None
    while time.monotonic() < end:
        report = soak.round()
        s = sample(i, len(QApplication.allWidgets()))
        first = first or s
        print(f"round {i}: {report.tokens} tokens, {report.replies} replies; {s.line()}", flush=True)
        i += 1
    if first is not None:
        print(f"window: {i} rounds; RSS {first.rss_mb:.0f} -> {s.rss_mb:.0f} MB, widgets {first.widgets} -> "
              f"{s.widgets}, OS threads {first.tasks} -> {s.tasks}, fds {first.fds} -> {s.fds}, "
              f"None's refs {first.none_refs} -> {s.none_refs}")
    w.close()


def server(model: Path, cache: Path, requests: int, every: int) -> None:
    from tests.soak_probes import sample_pid
    from tests.soak_server import Requests, serve, stop

    p, port = serve(model, cache)
    reqs = Requests(port, model.name)
    first = last = None
    try:
        for i in range(requests):
            reqs.one(i)
            if (i + 1) % every == 0:
                last = sample_pid(i + 1, p.pid)
                first = first or last
                print(last.line(), flush=True)
    finally:
        reqs.close()
        stop(p)
    if first is not None and last is not None:
        print(f"server: {requests} requests; RSS {first.rss_mb:.1f} -> {last.rss_mb:.1f} MB, OS threads "
              f"{first.tasks} -> {last.tasks}, fds {first.fds} -> {last.fds}")


def engine_chat(spec: str, turns: int, new: int, reply: int, budget_mib: int, context: int) -> None:
    """A chat of `turns` turns (~`new` tokens each, replies of `reply` tokens) with the engine
    alone; RSS and the memory's parts after each turn, then whether RSS leveled off once the
    memory tier was full (its bytes plus a turn's growth past the budget): what RSS still adds a
    turn beside what the conversation's own KV state adds (its prompt grows; `--context` caps it)."""
    from bench.common import text_of_tokens
    from engine.engine import Engine
    from engine.memory import MIB
    from engine.types import GenerationRequest, SamplerSettings

    eng = Engine(use_disk=False, memory_budget=budget_mib * MIB if budget_mib else None)
    eng.load(spec)
    eng.lm.eos_ids = set()  # every reply `reply` tokens long: the same work each turn
    settings = SamplerSettings(max_tokens=reply, temperature=0.7, seed=7)
    msgs: list[dict] = []
    seen = []
    per_token = 0.0  # KV bytes a token (from the snapshots the tier holds)
    for t in range(turns):
        msgs = msgs + [{"role": "user", "content": text_of_tokens(eng, new, 300 + t)}]
        r = eng.generate(GenerationRequest(msgs, settings, context_policy="truncate", context_length=context or None))
        msgs = msgs + [{"role": "assistant", "content": r.text}]
        m = eng.memory_report()
        per_token = max([per_token] + [x.nbytes / x.length for x in eng.cache.metas() if x.length])
        seen.append((r.report.prompt_tokens + len(r.tokens), m))
        print(f"turn {t}: prompt {r.report.prompt_tokens}, restored {r.report.restored}; RSS {m.rss / MIB:.0f} MB; "
              f"tier {m.tier / MIB:.0f} of {m.tier_budget / MIB:.0f} MB ({m.tier_entries} snapshots), live KV "
              f"{m.live_kv / MIB:.0f} MB, weights {m.weights / MIB:.0f} MB, MLX active {m.mlx_active / MIB:.0f} MB, "
              f"cache {m.mlx_cache / MIB:.0f} MB", flush=True)
    eng.close()
    rss = [m.rss / MIB for _, m in seen]
    step = max([b.tier - a.tier for (_, a), (_, b) in zip(seen, seen[1:])], default=0)
    full = next((i for i, (_, m) in enumerate(seen) if m.tier + step > m.tier_budget), None)
    print(f"engine: {turns} turns; RSS {rss[0]:.0f} -> {rss[-1]:.0f} MB "
          f"({(rss[-1] - rss[0]) / max(turns - 1, 1):.1f} MB a turn)")
    if full is None or full >= turns - 2:
        print("the memory tier never filled: nothing to level off yet (a smaller --memory-budget-mib fills it)")
        return
    n = turns - 1 - full
    before = (rss[full] - rss[0]) / max(full, 1)
    after = (rss[-1] - rss[full]) / n
    kv = (seen[-1][0] - seen[full][0]) * per_token / MIB / n
    print(f"the tier filled at turn {full}: RSS grew {before:.1f} MB a turn before, {after:.1f} MB a turn after; "
          f"the conversation's own KV state grew {kv:.1f} MB a turn after ({per_token / 1024:.0f} KB a token): "
          + ("levels off beside it" if after <= kv + 2 else f"{after - kv:.1f} MB a turn more than it"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=5.0, help="window rounds for this long (0: none)")
    ap.add_argument("--reply-tokens", type=int, default=400)
    ap.add_argument("--requests", type=int, default=10_000, help="server requests (0: none)")
    ap.add_argument("--every", type=int, default=500, help="requests between samples")
    ap.add_argument("--engine-turns", type=int, default=0, help="turns of a chat with the engine alone (0: none)")
    ap.add_argument("--engine-model", default="demo", help="its model (a spec: demo, a folder)")
    ap.add_argument("--engine-new", type=int, default=393, help="tokens of each user message")
    ap.add_argument("--engine-reply", type=int, default=300, help="tokens of each reply")
    ap.add_argument("--memory-budget-mib", type=int, default=0, help="the memory tier's budget (0: the default)")
    ap.add_argument("--context", type=int, default=0, help="context tokens at most, oldest turns left out (0: the model's)")
    args = ap.parse_args()
    if args.engine_turns > 0:
        engine_chat(args.engine_model, args.engine_turns, args.engine_new, args.engine_reply, args.memory_budget_mib,
                    args.context)
    from tests.tiny_models import build_model

    with tempfile.TemporaryDirectory() as d:
        model = build_model(Path(d) / "llama", family="llama")
        if args.minutes > 0:
            window(model, Path(d) / "data", args.minutes, args.reply_tokens)
        if args.requests > 0:
            server(model, Path(d) / "cache", args.requests, args.every)


if __name__ == "__main__":
    main()
