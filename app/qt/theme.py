"""Light and dark themes that follow the system colour scheme.

One `Theme` holds every colour the app uses: the Qt palette (Fusion style, so it looks the same
on every platform), the style sheet template in resources/styles/app.qss, and the colours the
markdown renderer writes into message HTML.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Optional

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

from app.core.conversation.markdown import Palette

RESOURCES = Path(__file__).resolve().parents[2] / "resources"


@dataclass(frozen=True)
class Theme:
    name: str  # "light" | "dark"
    window: str
    base: str  # chat background
    panel: str  # sidebar / composer background
    text: str
    muted: str
    accent: str
    accent_text: str
    border: str
    user_bg: str
    selected: str
    good: str
    bad: str
    code: Palette

    @property
    def dark(self) -> bool:
        return self.name == "dark"


LIGHT = Theme(
    name="light", window="#f6f7f9", base="#ffffff", panel="#f0f2f5", text="#1f2328", muted="#656d76",
    accent="#2f6fde", accent_text="#ffffff", border="#d8dde3", user_bg="#eef3fd", selected="#dfe8fb",
    good="#1a7f37", bad="#cf222e",
    code=Palette(),
)  # fmt: skip

DARK = Theme(
    name="dark", window="#1e2024", base="#17181b", panel="#202227", text="#e6e8eb", muted="#9198a1",
    accent="#4c8dff", accent_text="#ffffff", border="#33363d", user_bg="#232a36", selected="#2b3445",
    good="#3fb950", bad="#f85149",
    code=Palette(
        text="#e6e8eb", muted="#9198a1", link="#6cb6ff", code_bg="#0f1012", code_head="#25282e",
        code_border="#33363d",
        inline_code_bg="#2a2d33", quote="#9198a1", pygments_style="github-dark",
    ),
)  # fmt: skip


def system_theme() -> Theme:
    hints = QGuiApplication.styleHints()
    return DARK if hints.colorScheme() == Qt.ColorScheme.Dark else LIGHT


def theme_named(name: Optional[str]) -> Theme:
    """'light' | 'dark' | anything else (system)."""
    if name == "light":
        return LIGHT
    if name == "dark":
        return DARK
    return system_theme()


def palette_for(theme: Theme) -> QPalette:
    p = QPalette()
    roles = {
        QPalette.ColorRole.Window: theme.window,
        QPalette.ColorRole.WindowText: theme.text,
        QPalette.ColorRole.Base: theme.base,
        QPalette.ColorRole.AlternateBase: theme.panel,
        QPalette.ColorRole.Text: theme.text,
        QPalette.ColorRole.Button: theme.panel,
        QPalette.ColorRole.ButtonText: theme.text,
        QPalette.ColorRole.Highlight: theme.accent,
        QPalette.ColorRole.HighlightedText: theme.accent_text,
        QPalette.ColorRole.ToolTipBase: theme.panel,
        QPalette.ColorRole.ToolTipText: theme.text,
        QPalette.ColorRole.PlaceholderText: theme.muted,
        QPalette.ColorRole.Link: theme.code.link,
    }
    for role, colour in roles.items():
        p.setColor(role, QColor(colour))
    for role in (QPalette.ColorRole.WindowText, QPalette.ColorRole.Text, QPalette.ColorRole.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, role, QColor(theme.muted))
    return p


def style_sheet(theme: Theme) -> str:
    template = (RESOURCES / "styles" / "app.qss").read_text()
    values = {k: v for k, v in theme.__dict__.items() if isinstance(v, str)}
    icons = RESOURCES / "icons"
    values["chevron"] = (icons / f"chevron-down-{theme.name}.svg").as_posix()
    values["paperclip"] = (icons / f"paperclip-{theme.name}.svg").as_posix()
    return Template(template).safe_substitute(values)


def apply_theme(app: QApplication, theme: Theme) -> None:
    app.setStyle("Fusion")
    app.setPalette(palette_for(theme))
    app.setStyleSheet(style_sheet(theme))
