"""app/core/engine_link/api_keys.py: the API key the window remembers lives in the keyring, not in
settings.ini; a key an older version left in settings.ini moves there at the next start; with
no usable keyring it stays in the file, and the dialog's wording says so. Against a real
settings.ini (QSettings, as the window uses) and a file-backed keyring (tests/file_keyring.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import keyring
import pytest
from keyring.backends import chainer, fail
from keyring.errors import KeyringError

pytest.importorskip("PySide6")

from PySide6.QtCore import QSettings  # noqa: E402

from app.core.engine_link import api_keys  # noqa: E402
from tests.file_keyring import FileKeyring  # noqa: E402

URL = "http://127.0.0.1:8765"
OTHER = "http://127.0.0.1:9000"


def settings(path: Path) -> QSettings:
    """A window's settings.ini, opened afresh (as at a restart)."""
    return QSettings(str(path), QSettings.Format.IniFormat)


def file_text(s: QSettings) -> str:
    s.sync()
    return Path(s.fileName()).read_text(encoding="utf-8") if Path(s.fileName()).exists() else ""


@pytest.fixture
def no_keyring() -> Iterator[None]:
    """A machine with no keyring backend (keyring's own `fail` backend)."""
    before = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    try:
        yield
    finally:
        keyring.set_keyring(before)


class BrokenKeyring(FileKeyring):
    """A backend that exists but cannot store (e.g. a locked Secret Service collection)."""

    def set_password(self, service: str, username: str, password: str) -> None:
        raise KeyringError("the collection is locked")


def test_a_remembered_key_is_in_the_keyring_not_in_settings_ini_and_survives_a_restart(
    file_keyring: FileKeyring, tmp_path: Path
) -> None:
    ini = tmp_path / "settings.ini"
    s = settings(ini)
    assert api_keys.remember(s, URL, "s3cret", True) == "keyring"
    assert "s3cret" not in file_text(s) and f"url={URL}" in file_text(s)
    assert file_keyring.items() == {"Verbatim": {URL: "s3cret"}}
    again = settings(ini)
    assert api_keys.remembered_key(again, URL) == "s3cret"
    assert api_keys.remembered_key(again, OTHER) is None  # only the remembered server's
    assert api_keys.remember_label() == "Remember the key (kept in the system keyring)"


def test_not_remembering_forgets_the_key_and_a_new_server_forgets_the_old_ones(
    file_keyring: FileKeyring, tmp_path: Path
) -> None:
    s = settings(tmp_path / "settings.ini")
    api_keys.remember(s, URL, "s3cret", True)
    assert api_keys.remember(s, URL, "s3cret", False) == "none"
    assert file_keyring.items() == {"Verbatim": {}} and api_keys.remembered_key(s, URL) is None
    api_keys.remember(s, URL, "s3cret", True)
    assert api_keys.remember(s, OTHER, "other", True) == "keyring"
    assert file_keyring.items() == {"Verbatim": {OTHER: "other"}}  # the window remembers one server
    assert api_keys.remembered_key(s, OTHER) == "other" and "other" not in file_text(s)


def test_a_key_in_settings_ini_moves_to_the_keyring_at_the_next_start(
    file_keyring: FileKeyring, tmp_path: Path
) -> None:
    ini = tmp_path / "settings.ini"
    ini.write_text(f"[server]\nurl={URL}\nkey=s3cret\n", encoding="utf-8")  # as an older version wrote it
    s = settings(ini)
    assert api_keys.migrate(s) is True
    assert "s3cret" not in file_text(s) and f"url={URL}" in file_text(s)
    assert file_keyring.items() == {"Verbatim": {URL: "s3cret"}}
    assert api_keys.remembered_key(settings(ini), URL) == "s3cret"
    assert api_keys.migrate(settings(ini)) is False  # nothing left to move


def test_without_a_keyring_the_key_stays_in_settings_ini_and_the_dialog_says_so(
    no_keyring: None, tmp_path: Path
) -> None:
    assert api_keys.backend() is None
    assert api_keys.remember_label() == "Remember the key (kept in this data folder's settings, not encrypted)"
    keyring.set_keyring(chainer.ChainerBackend())  # a chainer of no backends: the same
    assert api_keys.backend() is None and "not encrypted" in api_keys.remember_label()
    ini = tmp_path / "settings.ini"
    s = settings(ini)
    assert api_keys.remember(s, URL, "s3cret", True) == "file"
    assert "key=s3cret" in file_text(s)
    assert api_keys.remembered_key(settings(ini), URL) == "s3cret"
    assert api_keys.migrate(settings(ini)) is False and "key=s3cret" in file_text(settings(ini))
    assert api_keys.remember(s, URL, "s3cret", False) == "none" and "s3cret" not in file_text(s)


def test_a_keyring_that_cannot_store_falls_back_to_settings_ini(tmp_path: Path) -> None:
    before = keyring.get_keyring()
    keyring.set_keyring(BrokenKeyring(tmp_path / "keyring.json"))
    try:
        s = settings(tmp_path / "settings.ini")
        assert api_keys.remember(s, URL, "s3cret", True) == "file"
        assert "key=s3cret" in file_text(s) and api_keys.remembered_key(s, URL) == "s3cret"
        assert api_keys.migrate(s) is False and "key=s3cret" in file_text(s)  # kept, not lost
    finally:
        keyring.set_keyring(before)
