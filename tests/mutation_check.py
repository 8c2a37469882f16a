"""Mutation check: every deliberate engine bug in MUTATIONS must make the tests fail.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 CI=1 \
        .venv/bin/python tests/mutation_check.py [-k NAME] [--keep]

For each mutation: copy the working tree (tracked and untracked, not ignored files) to a
temporary folder, apply the mutation's exact text replacements there (the checkout itself is
never touched), run the tests named as its catchers, and record which failed. A replacement
whose target text is not found exactly once stops the run (the code moved: update the list).
The unmutated tree runs the same tests first; they must all pass, or no "caught" means anything.

Prints a table (mutation -> caught? -> by which tests) and exits non-zero if any mutation
survives. Not part of `make test` (minutes, not seconds); run it after every change to the
cache path, and record the table in docs/testing.md. tests/test_mutation_targets.py checks on
every `make test` that each target text still exists, so this list cannot rot silently.
Run it with OpenBLAS preloaded (as `make test` does): several catchers are determinism tests
that only bite with an optimized BLAS (README, "Linux: OpenBLAS").
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

EC = "tests/test_engine_cache.py::"
DC = "tests/test_disk_cache.py::"
PL = "tests/test_cache_planner.py::"


@dataclass(frozen=True)
class Mutation:
    name: str
    edits: tuple[tuple[str, str, str], ...]  # (file, exact old text, new text)
    tests: tuple[str, ...]  # pytest node ids expected to catch it


MUTATIONS: list[Mutation] = [
    Mutation(
        "restore len instead of len-1",
        (("engine/cache/planner.py", "    limit = len(prompt) - 1\n", "    limit = len(prompt)\n"),
         # the loop's own guard goes too, or it alone would catch this
         ("engine/generate/loop.py", '    assert restored <= n_prompt - 1, "never restore the whole prompt"\n', "")),
        (EC + "test_whole_prompt_hit_restores_len_minus_one_and_is_identical",  # its fast-mode cases
         PL + "test_plan_never_restores_the_whole_prompt"),
    ),
    Mutation(
        "drop the aligned chunking (no cuts at multiples of C)",
        (("engine/cache/planner.py", "    cuts = set(range(chunk, last, chunk))\n", "    cuts = set()\n"),),
        (EC + "test_exact_mode_multi_turn_equals_cold_with_cache_used",
         EC + "test_prefill_after_an_unaligned_restore_is_cut_at_absolute_multiples",
         EC + "test_whole_prompt_bug_reproduced_on_purpose",
         EC + "test_report_describes_layers_and_aligned_chunks",
         PL + "test_schedule_cuts_multiples_of_c_message_starts_and_the_last_token"),
    ),
    Mutation(
        "drop the message-boundary cuts",
        (("engine/cache/planner.py", "    cuts.update(m for m in message_starts if 0 < m < last)\n", ""),),
        (EC + "test_exact_mode_multi_turn_equals_cold_with_cache_used",
         EC + "test_report_describes_layers_and_aligned_chunks",
         PL + "test_schedule_cuts_multiples_of_c_message_starts_and_the_last_token"),
    ),
    Mutation(
        "drop the chunk size from the model key",
        (("engine/engine.py", '{**options, "chunk": self.chunk, "dequantized": dequantized, **sharding}',
          '{**options, "dequantized": dequantized, **sharding}'),),
        (DC + "test_one_cache_dir_two_chunk_sizes_never_share_snapshots",),
    ),
    Mutation(
        "drop the world size and sharding from the model key",
        (("engine/engine.py", '{**options, "chunk": self.chunk, "dequantized": dequantized, **sharding}',
          '{**options, "chunk": self.chunk, "dequantized": dequantized}'),),
        ("tests/test_distributed.py::test_world_size_and_sharding_are_part_of_the_model_key",),
    ),
    Mutation(
        "trust the index's trimmable flag",
        (("engine/cache/disk/format.py", "    derived = can_trim_prompt_cache(cache)\n",
          "    derived = meta.trimmable\n"),),
        (DC + "test_forged_trimmable_flag_never_allows_a_partial_restore",),
    ),
    Mutation(
        "canonical length ignored: a fast restore's snapshots claim the whole schedule as exact",
        (("engine/generate/loop.py", "                exact_cuts = tuple(c for c in plan.meta.exact_cuts if c <= restored)\n",
          "                exact_cuts = cuts\n"),),
        (EC + "test_exact_regenerate_after_fast_mode_equals_cold",),
    ),
    Mutation(
        "reuse a fast-mode snapshot in exact mode (exact restores any matched point)",
        (("engine/cache/planner.py", '    if mode == "fast":\n', '    if mode in ("fast", "exact"):\n'),),
        (EC + "test_exact_mode_multi_turn_equals_cold_with_cache_used",
         EC + "test_exact_regenerate_after_fast_mode_equals_cold",
         PL + "test_reuse_point_exact_mode_falls_back_to_the_last_shared_cut"),
    ),
    Mutation(
        "exact at a shared cut whatever the cuts before it",
        (("engine/cache/planner.py", "    return mine == tuple(c for c in cuts if c <= reuse)\n",
          "    return reuse in cuts\n"),),
        (PL + "test_exact_at_only_where_both_schedules_made_the_same_cuts",),
    ),
    Mutation(
        "forget the pre-last snapshot",
        (("engine/generate/loop.py", "        if prelast_due and not all_plain_kv:\n", "        if False:\n"),),
        (EC + "test_whole_prompt_hit_restores_len_minus_one_and_is_identical",),
    ),
    Mutation(
        "memory tier evicts first in, not least recently used",
        (("engine/cache/memory.py", "                self._items.move_to_end(meta.id)\n", ""),),
        (EC + "test_memory_budget_evicts_least_recently_used",),
    ),
    Mutation(
        "a snapshot with a shorter exact history may replace one with a longer",
        (("engine/cache/planner.py", "    if a.exact_cuts[: len(b.exact_cuts)] != b.exact_cuts:\n        return False\n", ""),),
        (PL + "test_dominates_keeps_exact_states",),
    ),
]


def target_problems(mutations: list[Mutation], root: Path = ROOT) -> list[str]:
    """Why a mutation could not be applied to `root` as written (empty: all fine)."""
    out = []
    for m in mutations:
        for rel, old, _ in m.edits:
            n = (root / rel).read_text().count(old)
            if n != 1:
                out.append(f"{m.name}: target found {n} times in {rel}: {old.strip()[:80]!r}")
        for node in m.tests:
            rel, _, name = node.partition("::")
            if f"def {name.split('[')[0]}(" not in (root / rel).read_text():
                out.append(f"{m.name}: no test {node}")
    return out


def apply(tree: Path, m: Mutation) -> None:
    for rel, old, new in m.edits:
        path = tree / rel
        text = path.read_text()
        n = text.count(old)
        if n != 1:
            raise SystemExit(f"mutation {m.name!r}: target text found {n} times in {rel} (expected once); "
                             f"the code moved, update tests/mutation_check.py:\n{old}")
        path.write_text(text.replace(old, new))


def copy_tree(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def run_tests(tree: Path, tests: tuple[str, ...], tag: str) -> tuple[list[str], int]:
    """(node ids that failed or errored, pytest's exit code), run in `tree`."""
    xml = tree / f".mutation-{tag}.xml"
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
                           *tests], cwd=tree, env=env, capture_output=True, text=True)
    failed = []
    if xml.exists():
        for case in ET.parse(xml).getroot().iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                module = case.get("classname", "").replace(".", "/") + ".py"
                failed.append(f"{module}::{case.get('name')}")
    if proc.returncode not in (0, 1):  # 2+: interrupted, usage or collection error
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
    return failed, proc.returncode


def check_imports(tree: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", "import engine, engine.engine, engine.cache.disk.tier; "
                          "print(engine.__file__)"], cwd=tree, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"the tree in {tree} does not import:\n{out.stderr[-3000:]}")
    if not out.stdout.strip().startswith(str(tree)):
        raise SystemExit(f"`import engine` resolves to {out.stdout.strip()}, not the copy in {tree}")


def short(node: str) -> str:
    return node.split("/")[-1].replace(".py::", "::")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-k", help="only mutations whose name contains this")
    ap.add_argument("--keep", action="store_true", help="keep the temporary trees")
    args = ap.parse_args()
    chosen = [m for m in MUTATIONS if not args.k or args.k in m.name]
    if not chosen:
        raise SystemExit("no mutation matches")
    t_start = time.monotonic()
    base = Path(tempfile.mkdtemp(prefix="verbatim-mutants-"))
    rows = []
    try:
        problems = target_problems(chosen)  # every target exists before anything runs
        if problems:
            raise SystemExit("the code moved, update tests/mutation_check.py:\n" + "\n".join(problems))
        clean = base / "clean"
        copy_tree(clean)
        check_imports(clean)
        baseline = tuple(sorted({t for m in chosen for t in m.tests}))
        failed, rc = run_tests(clean, baseline, "baseline")
        if failed or rc != 0:
            print("The unmutated tree fails its own catchers; fix that first:", *failed, sep="\n  ")
            return 2
        print(f"baseline: {len(baseline)} catcher tests pass on the unmutated tree")
        for i, m in enumerate(chosen):
            tree = base / f"m{i}"
            copy_tree(tree)
            apply(tree, m)
            check_imports(tree)
            t0 = time.monotonic()
            failed, rc = run_tests(tree, m.tests, f"m{i}")
            caught = bool(failed)
            rows.append((m, caught, failed, time.monotonic() - t0))
            print(f"[{'caught' if caught else 'SURVIVED'}] {m.name} ({time.monotonic() - t0:.0f} s)", flush=True)
            if not args.keep:
                shutil.rmtree(tree, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print()
    print("| mutation | caught | by |")
    print("|---|---|---|")
    for m, caught, failed, _ in rows:
        by = ", ".join(sorted({short(f).split("[")[0] + ("[...]" if "[" in f else "") for f in failed})) or "-"
        print(f"| {m.name} | {'yes' if caught else 'NO'} | {by} |")
    survivors = [m.name for m, caught, _, _ in rows if not caught]
    print(f"\n{len(rows) - len(survivors)}/{len(rows)} mutations caught in {time.monotonic() - t_start:.0f} s")
    if survivors:
        print("SURVIVED:", *survivors, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
