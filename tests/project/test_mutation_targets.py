"""The mutation check itself (tests/mutation_check.py): its list cannot rot (every target text is
still in the sources exactly once, every named catcher exists), a mutation counts as caught
only when a catcher fails on an assertion, a hung run is cut at its timeout, a baseline with a
skipped or missing catcher is refused, and the docs table is rewritten row by row."""

from __future__ import annotations

from pathlib import Path

from tests.mutation_check import MUTATIONS, TABLE_HEAD, Mutation, Run, baseline_problems, record, run_tests, \
    target_problems

FAKE = '''
import threading
import pytest

@pytest.fixture
def broken():
    raise RuntimeError("a fixture error")

def test_assert():
    assert [1, 2] == [1, 3]

def test_assert_message():
    assert False, "with a message"

def test_raises():
    with pytest.raises(ValueError):
        pass

def test_crash():
    {}["the mutated code raised"]

def test_error(broken):
    pass

def test_skip():
    pytest.skip("not here")

def test_pass():
    pass

def test_hang():
    threading.Event().wait()
'''


def fake_tree(tmp_path: Path) -> Path:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "__init__.py").write_text("")
    (tmp_path / "tests" / "test_fake.py").write_text(FAKE)
    return tmp_path


def nodes(*names: str) -> tuple[str, ...]:
    return tuple(f"tests/test_fake.py::{n}" for n in names)


def test_every_mutation_target_and_catcher_exists():
    assert target_problems(MUTATIONS) == []
    assert all(m.tests for m in MUTATIONS)
    assert len({m.name for m in MUTATIONS}) == len(MUTATIONS)


def test_a_mutation_is_caught_only_by_an_assertion(tmp_path: Path) -> None:
    tree = fake_tree(tmp_path)
    run = run_tests(tree, nodes("test_assert", "test_assert_message", "test_raises", "test_crash", "test_error",
                                "test_skip", "test_pass"), "fake", 120)
    assert sorted(run.asserted) == sorted(nodes("test_assert", "test_assert_message", "test_raises"))
    assert sorted(run.crashed) == sorted(nodes("test_crash", "test_error"))
    assert run.skipped == list(nodes("test_skip")) and run.verdict() == "caught"
    only_crashes = run_tests(tree, nodes("test_crash", "test_error", "test_pass"), "crash", 120)
    assert only_crashes.asserted == [] and only_crashes.verdict() == "ERROR"
    assert run_tests(tree, nodes("test_pass"), "pass", 120).verdict() == "SURVIVED"
    missing = run_tests(tree, ("tests/test_fake.py::test_no_such_test",), "missing", 120)
    assert missing.verdict() == "ERROR" and missing.rc not in (0, 1)  # a collection failure is no catch


def test_a_hung_run_is_cut_at_its_timeout_and_is_no_catch(tmp_path: Path) -> None:
    run = run_tests(fake_tree(tmp_path), nodes("test_assert", "test_hang"), "hang", 3)
    assert run.timed_out and run.verdict() == "TIMEOUT"


def test_a_baseline_with_a_skipped_failing_or_missing_catcher_is_refused(tmp_path: Path) -> None:
    tree = fake_tree(tmp_path)
    catchers = nodes("test_pass", "test_skip", "test_nothing_by_this_name")
    run = run_tests(tree, nodes("test_pass", "test_skip"), "baseline", 120)
    assert baseline_problems(run, catchers) == [
        "skipped: tests/test_fake.py::test_skip", "did not run: tests/test_fake.py::test_nothing_by_this_name"]
    clean = run_tests(tree, nodes("test_pass"), "clean", 120)
    assert baseline_problems(clean, nodes("test_pass")) == []
    assert baseline_problems(Run([], [], [], [], -1), ()) == ["the run timed out"]


def test_record_rewrites_the_docs_table_row_by_row(tmp_path: Path, monkeypatch) -> None:
    import tests.mutation_check as mc

    a, b, c = (Mutation(n, (), ("t",)) for n in ("first", "second", "third"))
    monkeypatch.setattr(mc, "MUTATIONS", [a, b, c])
    docs = tmp_path / "testing.md"
    docs.write_text(f"intro\n\n{TABLE_HEAD}\n|---|---|---|---|\n| first | yes | x | old |\n| gone | yes | y | old |\n"
                    "\nafter\n")
    record({"second": "| second | yes | z | 2026-12-01 abc123 |"}, docs)
    assert docs.read_text() == (f"intro\n\n{TABLE_HEAD}\n|---|---|---|---|\n| first | yes | x | old |\n"
                                "| second | yes | z | 2026-12-01 abc123 |\n| third | not run yet | - | - |\n\nafter\n")
