"""The model manager: local models (discovery), GGUF import, download by repo id.

Discovery and downloads run on plain background threads (no MLX); GGUF import converts
weights with MLX, so it runs on the engine worker. Every long step shows progress and can be
cancelled; failures (offline, bad file) are shown in the dialog in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
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

from app.core.view_models import format_bytes
from app.qt.tasks import BackgroundTask
from app.qt.worker import EngineWorker

COLUMNS = ["Name", "Family", "Size", "Quantization", "Context", "Source"]


def entry_spec(entry: Any) -> str:
    """What Engine.load takes for a discovered model."""
    if entry.source == "demo":
        return "demo"
    if getattr(entry, "spec", None):
        return entry.spec  # a named model (gemma3-270m): loaded by name
    if entry.source == "hf-cache":
        return entry.name  # org/name, resolved through the HF cache
    return str(entry.path)


def discover(extra_dirs: list[str]) -> list[Any]:
    from engine.models.resolve import discover_models

    return discover_models([Path(d) for d in extra_dirs])


class ModelManager(QDialog):
    modelChosen = Signal(str, str)  # spec, display name
    dirsChanged = Signal(list)

    def __init__(
        self, worker: EngineWorker, extra_dirs: list[str], current_spec: str = "", parent: Optional[QWidget] = None
    ) -> None:
        super().__init__(parent)
        self.setObjectName("modelManager")
        self.setWindowTitle("Models")
        self.resize(780, 460)
        self.worker = worker
        self.extra_dirs = list(extra_dirs)
        self.current_spec = current_spec
        self.entries: list[Any] = []
        self._task: Optional[BackgroundTask] = None  # discovery or download
        self._import_job: Optional[int] = None
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

        self.import_button.clicked.connect(self._pick_gguf)
        self.folder_button.clicked.connect(self._pick_folder)
        self.refresh_button.clicked.connect(self.refresh)
        self.use_button.clicked.connect(self._use)
        self.download_button.clicked.connect(lambda: self.download(self.repo.text().strip()))
        self.repo.returnPressed.connect(lambda: self.download(self.repo.text().strip()))
        self.cancel_button.clicked.connect(self.cancel)
        worker.taskProgress.connect(self._on_import_progress)
        worker.taskDone.connect(self._on_import_done)
        worker.taskFailed.connect(self._on_import_failed)
        self.refresh()

    # -- discovery --------------------------------------------------------------------------------
    def refresh(self) -> None:
        if self._task is not None and self._task.running:
            return
        self.status.setText("Looking for models…")
        task = BackgroundTask(lambda: discover(self.extra_dirs), with_progress=False, parent=self)
        task.done.connect(self._on_discovered)
        task.failed.connect(lambda msg: self._set_status(f"Cannot list models: {msg}", error=True))
        self._task = task.start()

    def _on_discovered(self, entries: list[Any]) -> None:
        self.entries = entries
        self.table.setRowCount(len(entries))
        select = self._select_after or self.current_spec
        for r, e in enumerate(entries):
            ctx = f"{e.context_length:,}" if e.context_length else "–"
            source = {"hf-cache": "HF cache", "gguf": "imported GGUF", "folder": "folder", "demo": "built-in",
                      "named": "built-in"}.get(
                e.source, e.source
            )
            name = "SmolLM2-135M-Instruct (demo)" if e.source == "demo" else e.name
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
        name = "SmolLM2-135M-Instruct (demo)" if e.source == "demo" else e.name
        self.modelChosen.emit(entry_spec(e), name)
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
        from engine.models.gguf.convert import import_gguf
        from engine.paths import models_dir

        self._importing = Path(path).name
        self._busy(True, f"Importing {self._importing}…")

        def run(progress: Any, cancel: Any) -> Path:
            return import_gguf(path, models_dir(), progress, cancel)

        self._import_job = self.worker.run_task(run)

    def _on_import_progress(self, job: int, fraction: float, message: str) -> None:
        if job == self._import_job:
            self.progress.setValue(int(fraction * 1000))
            self.status.setText(f"Importing: {message} ({fraction:.0%})")

    def _on_import_done(self, job: int, folder: Any) -> None:
        if job != self._import_job:
            return
        self._import_job = None
        self._busy(False)
        self._select_after = str(folder)
        self._note = f"Imported into {folder}."
        self.refresh()

    def _on_import_failed(self, job: int, message: str) -> None:
        if job != self._import_job:
            return
        self._import_job = None
        self._busy(False)
        self._set_status("Import cancelled." if message == "cancelled" else f"Import failed ({self._importing}): {message}",
                         error=message != "cancelled")

    # -- download (background thread: network only) -------------------------------------------
    def download(self, repo_id: str) -> None:
        if not repo_id:
            self._set_status("Type a repo id such as mlx-community/SmolLM2-360M-Instruct.", error=True)
            return
        from engine.models.download import download_model

        self._busy(True, f"Downloading {repo_id}…")
        task = BackgroundTask(lambda progress, cancel: download_model(repo_id, progress, cancel), parent=self)
        task.progress.connect(self._on_download_progress)
        task.done.connect(lambda folder: self._on_download_done(repo_id, folder))
        task.failed.connect(self._on_download_failed)
        self._task = task.start()

    def _on_download_progress(self, fraction: float, message: str) -> None:
        self.progress.setValue(int(fraction * 1000))
        self.status.setText(message)

    def _on_download_done(self, repo_id: str, folder: Any) -> None:
        self._busy(False)
        self._task = None
        self._select_after = repo_id
        self._note = f"Downloaded {repo_id}."
        self.refresh()

    def _on_download_failed(self, message: str) -> None:
        self._busy(False)
        self._task = None
        self._set_status("Download cancelled." if message == "cancelled" else f"Download failed: {message}",
                         error=message != "cancelled")

    # -- common -----------------------------------------------------------------------------------
    def cancel(self) -> None:
        if self._import_job is not None:
            self.worker.cancel(self._import_job)
        if self._task is not None:
            self._task.cancel()

    def _busy(self, on: bool, message: str = "") -> None:
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
