"""Models -> "Connect to a Verbatim server…": the server's address and, if it asks for one, its
API key. The last address (and the key, when the user lets it be remembered) is filled in."""

from __future__ import annotations

import sys

from typing import Optional

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QVBoxLayout,
    QWidget,
)

from app.core.engine_link import api_keys

DEFAULT_URL = "http://127.0.0.1:8765"


class ServerDialog(QDialog):
    chosen = Signal(str, str, bool)  # url, api key ("" for none), remember the key

    def __init__(self, url: str = "", api_key: str = "", parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.setObjectName("serverDialog")
        self.setWindowTitle("Connect to a Verbatim server")
        lay = QVBoxLayout(self)
        intro = QLabel("The model runs on the server (one machine, or several ranks started with "
                       "<code>mlx.launch … python -m engine serve</code>); this window sends, "
                       "regenerates and verifies there. Conversations stay on this "
                       + ("Mac." if sys.platform == "darwin" else "computer."))
        intro.setWordWrap(True)
        lay.addWidget(intro)
        form = QFormLayout()
        self.url = QLineEdit(url or DEFAULT_URL)
        self.url.setObjectName("serverUrl")
        self.url.setPlaceholderText(DEFAULT_URL)
        self.key = QLineEdit(api_key)
        self.key.setObjectName("serverKey")
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.key.setPlaceholderText("none")
        form.addRow("Address:", self.url)
        form.addRow("API key:", self.key)
        lay.addLayout(form)
        self.remember = QCheckBox(api_keys.remember_label())  # the keyring, or (none there) settings.ini
        self.remember.setObjectName("rememberKey")
        self.remember.setChecked(bool(api_key))
        lay.addWidget(self.remember)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.connect_button = buttons.addButton("Connect", QDialogButtonBox.ButtonRole.AcceptRole)
        self.connect_button.setObjectName("serverConnectButton")
        self.connect_button.setDefault(True)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        lay.addWidget(buttons)
        self.url.textChanged.connect(lambda t: self.connect_button.setEnabled(bool(t.strip())))

    def accept(self) -> None:  # type: ignore[override]
        url = self.url.text().strip()
        if not url:
            return
        if "://" not in url:
            url = f"http://{url}"
        self.chosen.emit(url.rstrip("/"), self.key.text().strip(), self.remember.isChecked())
        super().accept()
