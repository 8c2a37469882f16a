"""The model manager: local models (discovery), GGUF import, download by repo id.

Each long step is a coroutine (app/qt/jobs.py): discovery and downloads await a background
thread (no MLX); GGUF import converts weights with MLX, so it awaits a job on the engine thread.
Every long step shows progress and can be cancelled (its CancelToken); failures (offline, bad
file) are shown in the dialog in one line.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Optional, Protocol

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)
from shiboken6 import isValid
from superqt.utils import qthrottled

from app.core.engine_link.models import discover, entry_name, entry_spec, source_label
from app.core.conversation.view_models import format_bytes
from app.qt import jobs
from engine.executor import EngineExecutor
from engine.types import CancelToken


class EngineJobs(Protocol):
    """Where the import runs (app/core/jobs.py's EngineJobs: the engine thread and its cancel tokens)."""

    executor: EngineExecutor

    def cancel_token(self) -> CancelToken: ...

COLUMNS = ["Name", "Family", "Size", "Quantization", "Context", "Source"]
PROGRESS_MS = 50  # an import's or a download's progress is shown at most this often (its last step always)


class ModelManager(QDialog):
    modelChosen = Signal(str, str)  # spec, display name
    dirsChanged = Signal(list)
    progressed = Signal(float, str)  # the import's or download's progress, as shown

    def __init__(
        self, controller: EngineJobs, extra_dirs: list[str], current_spec: str = "",
        parent: Optional[QWidget] = None,
    ) -> None:  # fmt: skip
        super().__init__(parent)
        self.setObjectName("modelManager")
        self.setWindowTitle("Models")
        self.resize(780, 460)
        self.controller = controller
        # The import's or download's progress, called on a worker thread: on this thread, throttled.
        self._throttled = qthrottled(self._on_progress, PROGRESS_MS)
        self._progress = jobs.to_gui(self._throttled)
        self._working = False  # an import or a download runs: its progress is shown
        self.extra_dirs = list(extra_dirs)
        self.current_spec = current_spec
        self.entries: list[Any] = []
        self._discovering = False
        self._cancel: Optional[CancelToken] = None  # the import's or download's
        self._select_after: Optional[str] = None
        self._importing = ""
        self._note = ""  # shown instead of the model count after the next discovery

        lay = QVBoxLayout(self)
        intro = QLabel("Models found on this machine. Double-click one (or select it and press Use) to load it.")
        intro.setObjectName("hint")
        lay.addWidget(intro)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setObjectName("modelTable")
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for c in range(1, len(COLUMNS)):
            self.table.horizontalHeader().setSectionResizeMode(c, QHeaderView.ResizeMode.ResizeToContents)
        self.table.doubleClicked.connect(lambda _: self._use())
        lay.addWidget(self.table, 1)

        row = QHBoxLayout()
        self.import_button = QPushButton("Import GGUF…")
        self.import_button.setObjectName("importGgufButton")
        self.folder_button = QPushButton("Add folder…")
        self.refresh_button = QPushButton("Refresh")
        self.use_button = QPushButton("Use")
        self.use_button.setObjectName("useModelButton")
        self.use_button.setDefault(True)
        for b in (self.import_button, self.folder_button, self.refresh_button):
            row.addWidget(b)
        row.addStretch(1)
        row.addWidget(self.use_button)
        lay.addLayout(row)

        dl = QHBoxLayout()
        dl.addWidget(QLabel("Download from Hugging Face:"))
        self.repo = QLineEdit()
        self.repo.setObjectName("repoId")
        self.repo.setPlaceholderText("mlx-community/SmolLM2-360M-Instruct")
        self.download_button = QPushButton("Download")
        self.download_button.setObjectName("downloadButton")
        dl.addWidget(self.repo, 1)
        dl.addWidget(self.download_button)
        lay.addLayout(dl)

        prog = QHBoxLayout()
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(False)
        self.progress.setVisible(False)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setObjectName("cancelTaskButton")
        self.cancel_button.setVisible(False)
        prog.addWidget(self.progress, 1)
        prog.addWidget(self.cancel_button)
        lay.addLayout(prog)
        self.status = QLabel("")
        self.status.setObjectName("managerStatus")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(self.status)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.close_button = buttons.button(QDialogButtonBox.StandardButton.Close)
        self.close_button.setObjectName("closeManagerButton")
        buttons.rejected.connect(self.reject)  # as Escape and the title bar's close do
        lay.addWidget(buttons)

        self.import_button.clicked.connect(self._pick_gguf)
        self.folder_button.clicked.connect(self._pick_folder)
        self.refresh_button.clicked.connect(self.refresh)
        self.use_button.clicked.connect(self._use)
        self.download_button.clicked.connect(lambda: self.download(self.repo.text().strip()))
        self.repo.returnPressed.connect(lambda: self.download(self.repo.text().strip()))
        self.cancel_button.clicked.connect(self.cancel)
        self.refresh()

    # -- discovery --------------------------------------------------------------------------------
    def refresh(self) -> None:
        if not self._discovering:
            jobs.spawn(self._discover())

    async def _discover(self) -> None:
        self._discovering = True
        self.status.setText("Looking for models…")
        try:
            entries = await jobs.in_thread(discover, self.extra_dirs)
        except Exception as e:
            if isValid(self):
                self._set_status(f"Cannot list models: {jobs.user_message(e)}", error=True)
            return
        finally:
            self._discovering = False
        if isValid(self):
            self._on_discovered(entries)

    def _on_discovered(self, entries: list[Any]) -> None:
        self.entries = entries
        self.table.setRowCount(len(entries))
        select = self._select_after or self.current_spec
        for r, e in enumerate(entries):
            ctx = f"{e.context_length:,}" if e.context_length else "–"
            source = source_label(e)
            name = entry_name(e)
            in_use = entry_spec(e) == self.current_spec or str(e.path) == self.current_spec
            if in_use:
                name += "  ● in use"
            for c, text in enumerate([name, e.family, format_bytes(e.size_bytes), e.quantization, ctx, source]):
                item = QTableWidgetItem(text)
                item.setToolTip(str(e.path))
                self.table.setItem(r, c, item)
            if entry_spec(e) == select or str(e.path) == select:
                self.table.selectRow(r)
        if not self.table.selectedItems() and entries:
            self.table.selectRow(0)  # the demo model comes first: preselected on a first run
        self._select_after = None
        note, self._note = self._note, ""
        if note:
            self._set_status(note)
            return
        self._set_status(f"{len(entries)} model{'s' if len(entries) != 1 else ''} found." if entries else
                         "No models found. Import a GGUF file or download one.")

    def _selected(self) -> Optional[Any]:
        rows = self.table.selectionModel().selectedRows()
        return self.entries[rows[0].row()] if rows else None

    def _use(self) -> None:
        e = self._selected()
        if e is None:
            return
        self.modelChosen.emit(entry_spec(e), entry_name(e))
        self.accept()

    def _pick_folder(self) -> None:
        d = QFileDialog.getExistingDirectory(self, "Folder with MLX models")
        if d:
            self.add_folder(d)

    def add_folder(self, folder: str) -> None:
        if folder not in self.extra_dirs:
            self.extra_dirs.append(folder)
            self.dirsChanged.emit(list(self.extra_dirs))
        self._select_after = folder
        self.refresh()

    # -- GGUF import (engine worker: MLX) -------------------------------------------------------
    def _pick_gguf(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import a GGUF model", "", "GGUF models (*.gguf)")
        if path:
            self.import_gguf(path)

    def import_gguf(self, path: str) -> None:
        self._importing = Path(path).name
        self._busy(True, f"Importing {self._importing}…")
        jobs.spawn(self._run("Import", self._import_job(path), self._importing))

    def _import_job(self, path: str) -> Any:
        """Convert on the engine thread (MLX), queued behind a reply that is being generated."""
        from engine.models.gguf.convert import import_gguf
        from engine.paths import models_dir

        cancel = self._cancel = self.controller.cancel_token()
        progress = self._progress
        return jobs.on_engine(self.controller.executor, lambda _engine: import_gguf(path, models_dir(), progress, cancel))

    # -- download (background thread: network only) -------------------------------------------
    def download(self, repo_id: str) -> None:
        if not repo_id:
            self._set_status("Type a repo id such as mlx-community/SmolLM2-360M-Instruct.", error=True)
            return
        from engine.models.download import download_model

        self._importing = ""
        self._busy(True, f"Downloading {repo_id}…")
        cancel = self._cancel = self.controller.cancel_token()
        jobs.spawn(self._run("Download", jobs.in_thread(download_model, repo_id, self._progress, cancel), repo_id))

    async def _run(self, what: str, job: Any, name: str) -> None:
        """Await an import or a download, then say how it went and list the models again."""
        cancel = self._cancel
        self._importing = name if what == "Import" else ""
        try:
            folder = await job
            if cancel is not None and cancel.cancelled:
                raise asyncio.CancelledError
        except BaseException as e:  # every way it can end is shown
            if not isValid(self):
                return
            self._busy(False)
            if isinstance(e, asyncio.CancelledError) or jobs.is_cancelled(e):
                self._set_status(f"{what} cancelled.")
            else:
                failed = f"{what} failed ({name})" if what == "Import" else f"{what} failed"
                self._set_status(f"{failed}: {jobs.user_message(e)}", error=True)
            return
        if not isValid(self):
            return
        self._busy(False)
        if what == "Import":
            self._select_after = str(folder)
            self._note = f"Imported into {folder}."
        else:
            self._select_after = name
            self._note = f"Downloaded {name}."
        self.refresh()

    def _on_progress(self, fraction: float, message: str) -> None:
        # A step the worker reported before it ended may arrive (queued, or the throttle's
        # trailing call) after the end was shown: it never writes over it.
        if not isValid(self) or not self._working:
            return
        self.progress.setValue(int(fraction * 1000))
        busy = self._importing and fraction < 1  # at the end the message says it all (no "(100%)")
        self.status.setText(f"Importing: {message} ({fraction:.0%})" if busy else message)
        self.progressed.emit(fraction, message)

    # -- common -----------------------------------------------------------------------------------
    def cancel(self) -> None:
        if self._cancel is not None:
            self._cancel.cancel()

    def _busy(self, on: bool, message: str = "") -> None:
        if not on:  # the last step the worker reported is shown (its signal sent) before the end
            self._throttled.flush(restart_timer=False)
        self._working = on
        self.progress.setVisible(on)
        self.progress.setValue(0)
        self.cancel_button.setVisible(on)
        for b in (self.import_button, self.download_button, self.use_button, self.folder_button):
            b.setEnabled(not on)
        if message:
            self._set_status(message)

    def _set_status(self, text: str, error: bool = False) -> None:
        self.status.setText(text)
        self.status.setProperty("error", error)
        self.status.style().unpolish(self.status)
        self.status.style().polish(self.status)

    def done(self, result: int) -> None:  # type: ignore[override]
        self.cancel()  # closing the dialog stops its import / download
        super().done(result)
