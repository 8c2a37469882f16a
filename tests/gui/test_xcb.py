"""The window under a real X server: tests/gui/xcb_window_checks.py, and the layout checks of
the offscreen suite that also need a real window system (XCB_TOO), in a pytest subprocess started
by `xvfb-run -a` with QT_QPA_PLATFORM=xcb (shortcut clashes of the X11 key bindings, layout at
800x600, 1000x700 and 1200x800 with the debug dock open: what the offscreen platform cannot show).

Skips without xvfb-run, except in CI (env CI set), where a missing X server is a failure:
.ci/run installs xvfb and the xcb libraries.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gui.driver import ROOT

CHECKS = "tests/gui/xcb_window_checks.py"
# Layout checks of the offscreen suite, run under a real window system as well.
XCB_TOO = ["tests/gui/test_regenerate.py::"
           "test_a_branch_explained_at_1200_px_with_the_dock_open_is_shown_whole_until_the_next_reply"]


@pytest.mark.gui
@pytest.mark.linux_only  # Xvfb and Qt's xcb platform; a Mac runs the cocoa platform
@pytest.mark.timeout(900)
def test_window_under_xvfb_with_the_xcb_platform(tmp_path: Path) -> None:
    xvfb_run = shutil.which("xvfb-run")
    if xvfb_run is None:
        if os.environ.get("CI"):
            pytest.fail("CI: xvfb-run is missing (apt-get install xvfb xauth): the xcb GUI tests cannot run")
        pytest.skip("xvfb-run not installed (apt-get install xvfb xauth): the xcb GUI tests need an X server")
    env = dict(os.environ, QT_QPA_PLATFORM="xcb")
    env.setdefault("VERBATIM_SHOTS", str(tmp_path))  # the windows' screenshots, for a look
    cmd = [xvfb_run, "-a", "-s", "-screen 0 1600x1200x24", sys.executable, "-m", "pytest", CHECKS,
           *XCB_TOO, "-q", "-rA", "-p", "no:cacheprovider", "--timeout", "300"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=840)
    out = proc.stdout + proc.stderr
    print(out[-6000:])
    assert proc.returncode == 0, f"{CHECKS} under Xvfb failed (exit {proc.returncode}):\n{out[-6000:]}"
    assert " passed" in out and "skipped" not in out.split("short test summary")[-1].lower()
