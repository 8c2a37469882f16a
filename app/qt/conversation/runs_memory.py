"""The run picked in each reply's runs menu, kept across restarts (issue 39): a view setting in
the data folder's settings.ini ("view/runs_shown"), not the conversation's data; the latest
RUNS_KEPT picks."""

from __future__ import annotations

import json

from PySide6.QtCore import QSettings

RUNS_KEPT = 500


def picked_runs(settings: QSettings) -> dict[int, int]:
    """reply id -> run index, as the last session left them ({} when none or unreadable)."""
    try:
        raw = json.loads(str(settings.value("view/runs_shown", "{}")))
        return {int(k): int(v) for k, v in raw.items()}
    except (ValueError, TypeError, AttributeError):
        return {}


def keep_picked_runs(settings: QSettings, runs: dict[int, int]) -> None:
    kept = dict(list(runs.items())[-RUNS_KEPT:])
    settings.setValue("view/runs_shown", json.dumps({str(k): v for k, v in kept.items()}))
