"""The window's small dialogs: errors, confirmations, a title, the export / import file."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from PySide6.QtCore import QSettings, Qt
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox, QWidget

from app.core.conversation.filenames import safe_filename
from engine.paths import documents_dir

MARKDOWN = "Markdown (*.md)"
VERBATIM_JSON = "Verbatim conversation (*.json)"


def error_box(parent: QWidget, title: str, text: str) -> QMessageBox:
    """A clear message over the window, non-blocking (nothing waits on the user)."""
    box = QMessageBox(QMessageBox.Icon.Warning, title, text, QMessageBox.StandardButton.Ok, parent)
    box.setObjectName("errorDialog")
    box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    box.setWindowModality(Qt.WindowModality.WindowModal)
    box.open()
    return box


def confirm(parent: QWidget, title: str, question: str) -> bool:
    """A destructive action's question: Enter and Escape both keep things as they are."""
    Button = QMessageBox.StandardButton
    box = QMessageBox(QMessageBox.Icon.Question, title, question, Button.Yes | Button.Cancel, parent)
    box.setObjectName("confirmDialog")
    box.setDefaultButton(Button.Cancel)
    box.setEscapeButton(Button.Cancel)
    return box.exec() == Button.Yes


def ask_title(parent: QWidget, current: str) -> Optional[str]:
    title, ok = QInputDialog.getText(parent, "Rename conversation", "Title:", text=current)
    return title.strip() if ok and title.strip() else None


def start_dir(settings: QSettings) -> Path:
    """Where a file dialog opens: the folder used last, else the user's documents folder (never
    the process's working directory)."""
    last = settings.value("files/last_dir")
    if isinstance(last, str) and last and Path(last).is_dir():
        return Path(last)
    docs = documents_dir()
    # A folder that does not exist makes Qt's dialog open in the working directory: home instead.
    return docs if docs.is_dir() else Path.home()


def _used(settings: QSettings, path: str) -> Optional[str]:
    if path:
        settings.setValue("files/last_dir", str(Path(path).parent))
    return path or None


def save_path(parent: QWidget, settings: QSettings, caption: str, name: str, filters: str) -> Optional[str]:
    """Where to write a file named `name` (suggested in the start folder)."""
    path, _ = QFileDialog.getSaveFileName(parent, caption, str(start_dir(settings) / name), filters)
    return _used(settings, path)


def export_path(parent: QWidget, title: str, settings: QSettings) -> Optional[str]:
    """Where to export; the suggested name is the title made safe ("Why is the sky blue.md")."""
    return save_path(parent, settings, "Export conversation", safe_filename(title, ".md"),
                     f"{MARKDOWN};;{VERBATIM_JSON}")


def import_path(parent: QWidget, settings: QSettings) -> Optional[str]:
    path, _ = QFileDialog.getOpenFileName(parent, "Import conversation", str(start_dir(settings)), VERBATIM_JSON)
    return _used(settings, path)
