"""No test module imports another, and nothing else imports one either: what tests share is a
fixture (the conftest.py of tests/ or of the area) or a helper module whose name does not start
with `test_` (tests/server_helpers.py, tests/tool_fixtures.py, ...). A test module imported
elsewhere runs its module-level code and its fixtures twice, and ties the two files' moves and
renames together. Read from the source with ast: imports at any depth (inside functions too),
`from tests.x import test_y`, relative imports, and `importlib.import_module("...")`."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("tests", "bench")  # the test suite, and the scripts that borrow its data


def _is_test_module(dotted: str) -> bool:
    return dotted.rsplit(".", 1)[-1].startswith("test_")


def _package(rel: Path) -> list[str]:
    """The dotted package a file at `rel` (relative to the repository root) is in."""
    return list(rel.parent.parts)


def imports_of_test_modules(source: str, rel: Path) -> list[str]:
    """'line: module' for every import of a test module in `source` (the file at `rel`)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _package(rel)[: len(_package(rel)) - (node.level - 1)] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            names = [module] + [f"{module}.{a.name}" for a in node.names]
        elif (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
              and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
              in ("import_module", "__import__")
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names = [node.args[0].value]
        found += [(node.lineno, n) for n in names if _is_test_module(n)]
    return [f"{line}: {name}" for line, name in sorted(found)]


def test_no_module_imports_a_test_module() -> None:
    files = sorted(p for folder in CHECKED for p in (ROOT / folder).rglob("*.py"))
    assert len([p for p in files if p.name.startswith("test_")]) > 80  # the walk found the suite
    found = {}
    for path in files:
        rel = path.relative_to(ROOT)
        if hits := imports_of_test_modules(path.read_text(encoding="utf-8"), rel):
            found[str(rel)] = hits
    assert found == {}, "move what is shared into a conftest.py fixture or a helper module"


def test_the_check_finds_planted_imports_of_test_modules() -> None:
    planted = '''
import json
from tests.server_helpers import Server
from tests.serve.test_server import Server
import tests.engine.test_constraints as c
from tests.cache import test_disk_cache
from .test_documents import REPORT
from . import test_continue, conftest


def helper():
    from tests.test_old_flat import thing
    return importlib.import_module("tests.engine.test_stop_strings")


from tests.engine import conftest
from ..cache.disk_helpers import KEY
from tests.testing_notes import x
'''
    found = imports_of_test_modules(planted, Path("tests/engine/test_planted.py"))
    assert found == ["4: tests.serve.test_server", "5: tests.engine.test_constraints",
                     "6: tests.cache.test_disk_cache", "7: tests.engine.test_documents",
                     "8: tests.engine.test_continue", "12: tests.test_old_flat",
                     "13: tests.engine.test_stop_strings"], found
