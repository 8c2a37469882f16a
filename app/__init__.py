"""Verbatim desktop app (PySide6). A thin layer over `engine`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.qt.window.window import MainWindow


def build_main_window(model: str, data_dir: Path, **options: Any) -> "MainWindow":
    """The shown main window, wired to a real engine worker.

    Conversations, settings and the prompt cache (`data_dir/cache`) all live under `data_dir`, so
    tests and scripts are isolated from the user's data. Options: chunk (prefill chunk size), context_length (a smaller context than the model's),
    use_disk (persistent prompt cache), theme ("light" | "dark" | "system"), batch_interval.
    Creates the QApplication if there is none yet.
    """
    from PySide6.QtWidgets import QApplication

    from app.qt.main import ensure_application
    from app.qt.window.window import MainWindow

    ensure_application()
    assert QApplication.instance() is not None
    window = MainWindow(model, Path(data_dir), **options)
    window.show()
    return window


__all__ = ["build_main_window"]
