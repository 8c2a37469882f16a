"""`python -m app` / `verbatim`: the Qt application, a qasync event loop and the main window."""

from __future__ import annotations

import argparse
import asyncio
import atexit
import logging
import signal
import sys
from pathlib import Path
from typing import Optional, Sequence

from PySide6.QtCore import QSettings, QTimer
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication, QMessageBox

from app.qt import jobs
from app.qt.theme import RESOURCES
from engine.paths import APP_NAME, prompt_cache_dir
from engine.paths import data_dir as default_data_dir

log = logging.getLogger("verbatim")


def ensure_application(argv: Optional[Sequence[str]] = None) -> QApplication:
    """The QApplication, and with it the qasync event loop every GUI flow runs on (app/qt/jobs.py):
    `python -m app` runs that loop; under pytest-qt, Qt's own event processing drives it."""
    app = QApplication.instance()
    if app is None:
        app = QApplication(list(argv) if argv is not None else [sys.argv[0]])
    assert isinstance(app, QApplication)
    if app.property("verbatimLoop") is None:
        import qasync

        loop = qasync.QEventLoop(app)
        asyncio.set_event_loop(loop)
        jobs.install_loop(loop)
        app.setProperty("verbatimLoop", True)
        atexit.register(_close_loop, loop)
    app.setApplicationName(APP_NAME)
    app.setOrganizationName(APP_NAME)
    app.setApplicationDisplayName(APP_NAME)
    icon = RESOURCES / "icons" / "verbatim.png"
    if icon.is_file():
        app.setWindowIcon(QIcon(str(icon)))
    return app


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    try:
        if not loop.is_running():
            loop.close()
    except RuntimeError:  # Qt already gone at exit
        pass


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="verbatim", description="Local LLM chat: regenerate is instant and identical.")
    p.add_argument("--model", help="demo, a .gguf file, an MLX model folder, an org/name in the HF cache "
                   "or a Verbatim server's address (http://host:port: the window attaches to it) "
                   "(default: the last one used, else demo)")
    p.add_argument("--data-dir", type=Path, default=None, help="conversations and settings "
                   f"(default: {default_data_dir()}); a folder given here also holds its own prompt cache")
    p.add_argument("--cache-dir", type=Path, default=None, help="the prompt cache "
                   f"(default: {prompt_cache_dir()}, or DATA_DIR/cache with --data-dir)")
    p.add_argument("--chunk", type=int, default=512, help="prefill chunk size (part of the cache key)")
    p.add_argument("--context-length", type=int, default=None,
                   help="use at most this many tokens of context (default: the model's own)")
    p.add_argument("--no-disk-cache", action="store_true", help="keep the prompt cache in memory only")
    p.add_argument("--theme", choices=["system", "light", "dark"], default=None)
    return p.parse_args(argv)


def cache_dir_for(args: argparse.Namespace) -> Optional[Path]:
    """The README's place for the prompt cache (the user cache folder, not backed up), unless a
    data folder was given: then it is self-contained (None: the window uses DATA_DIR/cache)."""
    return args.cache_dir or (None if args.data_dir else prompt_cache_dir())


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    app = ensure_application()
    data_dir: Path = args.data_dir or default_data_dir()
    model = args.model
    if not model:
        last = QSettings(str(data_dir / "settings.ini"), QSettings.Format.IniFormat).value("model/last")
        model = last if isinstance(last, str) and last else "demo"

    from app.core.store import StoreError
    from app.qt.window.window import MainWindow

    loop = jobs.gui_loop()
    try:
        window = MainWindow(model, data_dir, cache_dir=cache_dir_for(args), chunk=args.chunk, use_disk=not args.no_disk_cache, theme=args.theme,
                            context_length=args.context_length)
    except StoreError as e:  # e.g. a damaged or newer conversation database: say so, change nothing
        QMessageBox.critical(None, APP_NAME, str(e))
        return 1
    window.show()
    closed = asyncio.Event()
    app.aboutToQuit.connect(closed.set)
    app.lastWindowClosed.connect(closed.set)
    # Ctrl+C / SIGTERM close the window like the close button (the reply in progress is saved).
    # Python runs signal handlers only between bytecodes: a light timer gives it the chance.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: window.close())
    tick = QTimer()
    tick.timeout.connect(lambda: None)
    tick.start(200)
    with loop:
        loop.call_soon(log.info, "ready: the window is shown and the event loop runs")
        loop.run_until_complete(closed.wait())
        window.shutdown()
        loop.run_until_complete(window.models.server_toggle.wait_stopped())  # connections closed, port freed
    tick.stop()
    window.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
