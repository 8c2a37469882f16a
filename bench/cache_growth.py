"""What the persistent prompt cache costs as a conversation grows (issue 27: the block store).

    .venv/bin/python bench/cache_growth.py [--turns 12 48] [--variants] [--system] [--model demo]

Chat: one Engine with its default disk tier (a fresh folder), exact mode, greedy, 40-token
replies; each turn adds a user message of ~25 tokens (and the reply and the template's headers:
~69 tokens a turn). After each turn the disk writer is flushed and the tier's own counters are
read: bytes written this turn, unique bytes on disk (the pack files, each once), and the state
the conversation now has (the longest snapshot's bytes). Ratios: on disk / final state, and
bytes written at the last turn / the state of the tokens added that turn; and the memory tier's
bytes (unique: each block once) / the final state.

Variants: 4 replies (seeds 1-4, T=1, 40 tokens) to one ~600-token conversation: on disk / one
variant's state. System prompt: two conversations opening with the same ~1k-token system
prompt: on disk / what the two would take stored apart.

The folder's files are also listed and summed, so the tier's counters are checked against the
disk. VERBATIM_ROOT=<checkout> runs the same script against another checkout (old vs new).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(os.environ.get("VERBATIM_ROOT") or Path(__file__).resolve().parent.parent)
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from bench import common as C  # noqa: E402

REPLY = 40
WORDS = ["cache", "block", "turn", "reply", "model", "token", "state", "disk", "prefix", "chain", "memory",
         "exact", "forward", "schedule", "manifest", "budget"]


def user_message(turn: int) -> str:
    """~25 tokens, different every turn (deterministic)."""
    words = " ".join(WORDS[(turn * 7 + i * 3) % len(WORDS)] for i in range(16))
    return f"Turn {turn}: tell me more about the {words}."


def folder_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and p.name != ".lock")


def state_bytes(root: Path) -> tuple[int, int]:
    """(bytes, tokens) of the longest snapshot in the folder's index."""
    rows = json.loads((root / "index.json").read_text())["entries"]
    best = max(rows, key=lambda r: len(r["tokens"]))
    return best["nbytes"], len(best["tokens"])


def generate(engine, messages, **sampler):
    from engine.types import GenerationRequest, SamplerSettings

    r = engine.generate(GenerationRequest(messages, SamplerSettings(max_tokens=REPLY, **sampler)))
    assert engine.cache.disk.flush(60)
    return r


def chat(model: str, turns: int, work: Path) -> dict:
    root = work / f"chat-{turns}"
    engine, _ = C.load_engine(model, cache_dir=root)
    messages: list[dict[str, str]] = []
    rows = []
    written_before, prompt_before = 0, 0
    for turn in range(1, turns + 1):
        messages.append({"role": "user", "content": user_message(turn)})
        r = generate(engine, messages)
        messages.append({"role": "assistant", "content": r.text})
        stats = engine.cache.disk.stats()
        state, length = state_bytes(root)
        total_tokens = r.report.prompt_tokens + len(r.tokens)
        added = total_tokens - prompt_before
        written = stats["bytes_written"] - written_before
        per_token = state / length
        memory = engine.cache.stats()["memory_bytes"]
        rows.append({"turn": turn, "prompt": r.report.prompt_tokens, "added": added, "written": written,
                     "on_disk": stats["bytes"], "folder": folder_bytes(root), "state": state, "memory": memory,
                     "restored": r.report.restored, "written_per_added": written / (added * per_token)})
        C.log(f"  turn {turn:2d}: prompt {r.report.prompt_tokens:5d}  added {added:4d}  written {C.fmt_bytes(written):>9}"
              f"  on disk {C.fmt_bytes(stats['bytes']):>9}  state {C.fmt_bytes(state):>9}"
              f"  disk/state {stats['bytes'] / state:5.2f}  written/added {rows[-1]['written_per_added']:5.2f}"
              f"  memory/state {memory / state:5.2f}")
        written_before, prompt_before = stats["bytes_written"], total_tokens
    engine.close()
    last = rows[-1]
    return {"turns": turns, "rows": rows, "disk_over_state": last["on_disk"] / last["state"],
            "memory_over_state": last["memory"] / last["state"],
            "written_over_added": last["written_per_added"], "folder_matches": last["folder"] >= last["on_disk"]}


def variants(model: str, work: Path) -> dict:
    root = work / "variants"
    engine, _ = C.load_engine(model, cache_dir=root)
    messages = C.messages_for_length(engine, 600, salt=27)
    one = None
    for seed in (1, 2, 3, 4):
        generate(engine, messages, temperature=1.0, seed=seed)
        if one is None:
            one = state_bytes(root)[0]
    on_disk = engine.cache.disk.stats()["bytes"]
    memory = engine.cache.stats()["memory_bytes"]
    engine.close()
    C.log(f"  4 variants of a {len(engine.prompt_ids(messages))}-token prompt: on disk {C.fmt_bytes(on_disk)},"
          f" one variant's state {C.fmt_bytes(one)}: {on_disk / one:.2f}x; in memory {memory / one:.2f}x")
    return {"on_disk": on_disk, "one_state": one, "ratio": on_disk / one, "memory": memory,
            "memory_ratio": memory / one}


def system_prompt(model: str, work: Path) -> dict:
    root = work / "system"
    engine, _ = C.load_engine(model, cache_dir=root)
    system = C.text_of_tokens(engine, 1000, salt=11)
    states = []
    for i in (1, 2):
        generate(engine, [{"role": "system", "content": system}, {"role": "user", "content": user_message(i)}])
        states.append(state_bytes(root)[0] if i == 1 else None)
    rows = json.loads((root / "index.json").read_text())["entries"]
    apart = sum(r["nbytes"] for r in rows)
    on_disk = engine.cache.disk.stats()["bytes"]
    engine.close()
    C.log(f"  two chats sharing a ~1k-token system prompt: on disk {C.fmt_bytes(on_disk)},"
          f" stored apart {C.fmt_bytes(apart)}: {on_disk / apart:.2f}x")
    return {"on_disk": on_disk, "apart": apart, "ratio": on_disk / apart}


def restore(model: str, n: int, work: Path, repeat: int = 3) -> dict:
    """Time to first token of a regenerate restored from disk (a fresh Engine on the folder: an
    app restart) and from memory, against the cold run and a decode step, at `n` prompt tokens."""
    from engine.types import GenerationRequest, SamplerSettings

    root = work / f"restore-{n}"
    req = None
    # "memory_before_forward": a memory regenerate's time to first token less its one forward (the
    # last prompt token: as wide as a decode step), i.e. what planning and the restore cost it.
    out: dict = {"n": n, "disk": [], "memory": [], "memory_before_forward": []}
    for i in range(repeat):
        engine, _ = C.load_engine(model, cache_dir=root)
        C.warm_up(engine)
        msgs = C.messages_for_length(engine, n, salt=4349)
        req = GenerationRequest(msgs, SamplerSettings(max_tokens=16))
        r = engine.generate(req)
        key = "cold" if i == 0 else "disk"
        if key == "cold":
            out["cold"] = r.report.ttft_s
            out["step"] = 1 / r.report.decode_tps if r.report.decode_tps else None
        else:
            assert r.report.source == "disk", r.report.source
            out["disk"].append(r.report.ttft_s)
        m = engine.generate(req)
        assert m.report.source == "memory"
        out["memory"].append(m.report.ttft_s)
        out["memory_before_forward"].append(m.report.ttft_s - 1 / m.report.prefill_tps)
        engine.close()
    C.log(f"  restore at {n} tokens: cold {C.fmt_s(out['cold'])}, step {C.fmt_s(out['step'])}, "
          f"disk {', '.join(C.fmt_s(x) for x in out['disk'])}, memory {', '.join(C.fmt_s(x) for x in out['memory'])} "
          f"(before its forward: {', '.join(C.fmt_s(x) for x in out['memory_before_forward'])})")
    return out


def under_load(model: str, work: Path, n: int = 6) -> dict:
    """Decode speed of back-to-back generations (new ~600-token prompts, 64 tokens each) with the
    disk tier writing in the background (a write is held at most MAX_HOLD_S, so it lands during
    the next generations) against the same with no disk tier; and whether every reply reached
    the disk before the last generation ended."""
    from engine.types import GenerationRequest, SamplerSettings

    out: dict = {}
    for label, use_disk in (("memory only", False), ("disk tier", True)):
        engine, _ = C.load_engine(model, use_disk=use_disk, cache_dir=(work / "load") if use_disk else None)
        C.warm_up(engine)
        rates = []
        for i in range(n):
            msgs = C.messages_for_length(engine, 600, salt=5000 + i)
            r = engine.generate(GenerationRequest(msgs, SamplerSettings(max_tokens=64)))
            rates.append(r.report.decode_tps)
        entries = engine.cache.disk.stats()["entries"] if use_disk else None
        out[label] = {"decode_tps": C.median(rates[1:]), "entries_before_close": entries}
        engine.close()
    cost = 1 - out["disk tier"]["decode_tps"] / out["memory only"]["decode_tps"]
    out["decode_cost"] = cost
    C.log(f"  back to back: decode {out['memory only']['decode_tps']:.1f} tok/s memory only, "
          f"{out['disk tier']['decode_tps']:.1f} with the disk writing ({cost * 100:+.1f}%); "
          f"{out['disk tier']['entries_before_close']} of {n} replies on disk before the last ended")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="demo")
    p.add_argument("--turns", type=int, nargs="*", default=[12, 48])
    p.add_argument("--variants", action="store_true", help="also the 4-variant run")
    p.add_argument("--system", action="store_true", help="also the shared system prompt run")
    p.add_argument("--load", action="store_true", help="also decode speed under back-to-back writes")
    p.add_argument("--restore", type=int, default=0, help="also time regenerates restored at this many tokens")
    args = p.parse_args()
    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="cache-growth-"))
    out: dict = {"root": str(ROOT), "chats": []}
    try:
        for n in args.turns:
            C.log(f"chat, {n} turns ({args.model}, exact, greedy, {REPLY}-token replies):")
            out["chats"].append(chat(args.model, n, work))
        if args.variants:
            out["variants"] = variants(args.model, work)
        if args.system:
            out["system"] = system_prompt(args.model, work)
        if args.load:
            out["load"] = under_load(args.model, work)
        if args.restore:
            out["restore"] = restore(args.model, args.restore, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    C.log("summary:")
    for c in out["chats"]:
        C.log(f"  {c['turns']} turns: on disk / final state {c['disk_over_state']:.2f}x (<= 2.0);"
              f" written at the last turn / state added {c['written_over_added']:.2f}x (<= 2.0)")
    if "variants" in out:
        C.log(f"  4 variants: on disk / one variant {out['variants']['ratio']:.2f}x (<= 1.3)")
    if "system" in out:
        C.log(f"  shared system prompt: on disk / stored apart {out['system']['ratio']:.2f}x")
    C.log(f"  ({time.perf_counter() - t0:.0f} s)")
    print(json.dumps({k: v for k, v in out.items() if k != "chats"} | {
        "chats": [{k: v for k, v in c.items() if k != "rows"} for c in out["chats"]]}, indent=1))


if __name__ == "__main__":
    main()
