"""The window's small dialogs: errors, confirmations, a title, the export / import file."""

from __future__ import annotations

from typing import Optional

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox, QWidget

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
    return QMessageBox.question(parent, title, question) == QMessageBox.StandardButton.Yes


def ask_title(parent: QWidget, current: str) -> Optional[str]:
    title, ok = QInputDialog.getText(parent, "Rename conversation", "Title:", text=current)
    return title.strip() if ok and title.strip() else None


def export_path(parent: QWidget, title: str) -> Optional[str]:
    path, _ = QFileDialog.getSaveFileName(parent, "Export conversation", f"{title}.md", f"{MARKDOWN};;{VERBATIM_JSON}")
    return path or None


def import_path(parent: QWidget) -> Optional[str]:
    path, _ = QFileDialog.getOpenFileName(parent, "Import conversation", "", VERBATIM_JSON)
    return path or None
