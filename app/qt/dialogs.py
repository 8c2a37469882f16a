"""The window's small dialogs: errors, confirmations, a title, the export / import file."""

from __future__ import annotations

from typing import Optional

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox, QWidget

from app.core.filenames import safe_filename

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


def export_path(parent: QWidget, title: str) -> Optional[str]:
    """Where to export; the suggested name is the title made safe ("Why is the sky blue.md")."""
    path, _ = QFileDialog.getSaveFileName(parent, "Export conversation", safe_filename(title, ".md"),
                                          f"{MARKDOWN};;{VERBATIM_JSON}")
    return path or None


def import_path(parent: QWidget) -> Optional[str]:
    path, _ = QFileDialog.getOpenFileName(parent, "Import conversation", "", VERBATIM_JSON)
    return path or None
