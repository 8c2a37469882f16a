"""Verbatim desktop app (PySide6). A thin layer over `engine`."""
