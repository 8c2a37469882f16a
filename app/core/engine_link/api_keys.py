"""The API key the window remembers for its Verbatim server: kept in the system keyring through
`keyring` (the macOS Keychain; Secret Service on Linux), under the service "Verbatim" and the
server's address as the account. Only where no usable keyring backend exists (keyring's `fail`
backend, its `null` one, or a chainer of no backends) does the key stay in the data folder's
settings.ini (`server/key`), in plain text, as the Connect dialog then says. A key an older
version left in settings.ini moves to the keyring at the next start (`migrate`).

Qt-free: the settings are anything with QSettings' `value` / `setValue` / `remove`.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal, Optional, Protocol

import keyring
from keyring.backend import KeyringBackend
from keyring.errors import KeyringError, PasswordDeleteError

log = logging.getLogger(__name__)

SERVICE = "Verbatim"  # the keyring item's service; its account ("username") is the server's address
URL_SETTING = "server/url"  # the remembered server (settings.ini)
FILE_SETTING = "server/key"  # its key, only where no keyring backend exists

Where = Literal["keyring", "file", "none"]


class Settings(Protocol):
    """What this module needs of QSettings (the window's settings.ini)."""

    def value(self, key: str) -> Any: ...

    def setValue(self, key: str, value: Any) -> None: ...

    def remove(self, key: str) -> None: ...


def backend() -> Optional[KeyringBackend]:
    """The keyring backend keys go to, or None where there is no usable one."""
    from keyring.backends import chainer, fail, null

    kr = keyring.get_keyring()
    if isinstance(kr, (fail.Keyring, null.Keyring)):
        return None
    if isinstance(kr, chainer.ChainerBackend) and not kr.backends:
        return None
    return kr


def remember_label() -> str:
    """The Connect dialog's checkbox: where a remembered key is kept, truthfully."""
    kr = backend()
    if kr is None:
        return "Remember the key (kept in this data folder's settings, not encrypted)"
    if sys.platform == "darwin" and type(kr).__module__.startswith("keyring.backends.macOS"):
        return "Remember the key (kept in the macOS Keychain)"
    return "Remember the key (kept in the system keyring)"


def _file_key(settings: Settings) -> Optional[str]:
    key = settings.value(FILE_SETTING)
    return key if isinstance(key, str) and key else None


def remembered_key(settings: Settings, url: str) -> Optional[str]:
    """The remembered key of the server at `url` (the keyring's, else the file's), or None."""
    if settings.value(URL_SETTING) != url:
        return None
    kr = backend()
    if kr is not None:
        try:
            key = kr.get_password(SERVICE, url)
        except KeyringError as e:  # e.g. a locked Secret Service collection: the file's, if any
            log.warning("cannot read the API key from the keyring (%s)", e)
        else:
            if key:
                return key
    return _file_key(settings)


def _forget(kr: Optional[KeyringBackend], url: str) -> None:
    if kr is None or not url:
        return
    try:
        kr.delete_password(SERVICE, url)
    except PasswordDeleteError:
        pass  # nothing was kept for it
    except KeyringError as e:
        log.warning("cannot remove the API key of %s from the keyring (%s)", url, e)


def remember(settings: Settings, url: str, key: str, keep: bool) -> Where:
    """The server at `url` becomes the remembered one; its key is kept (`keep` and a key) in the
    keyring, else in settings.ini with a warning; not kept, any earlier one is forgotten.
    Returns where the key went. The previous server's key is forgotten either way (the window
    remembers one server)."""
    previous = settings.value(URL_SETTING)
    kr = backend()
    if isinstance(previous, str) and previous != url:
        _forget(kr, previous)
    settings.setValue(URL_SETTING, url)
    if not (keep and key):
        _forget(kr, url)
        settings.remove(FILE_SETTING)
        return "none"
    if kr is not None:
        try:
            kr.set_password(SERVICE, url, key)
        except KeyringError as e:
            log.warning("cannot store the API key in the keyring (%s)", e)
        else:
            settings.remove(FILE_SETTING)
            return "keyring"
    log.warning("no usable keyring: the API key of %s is kept in plain text in settings.ini", url)
    settings.setValue(FILE_SETTING, key)
    return "file"


def migrate(settings: Settings) -> bool:
    """Move a key an older version kept in settings.ini into the keyring (and out of the file).
    True when one moved; False when there was none, or no usable keyring (it stays in the file)."""
    key, url = _file_key(settings), settings.value(URL_SETTING)
    if key is None or not isinstance(url, str) or not url:
        return False  # the usual start: no keyring asked at all
    kr = backend()
    if kr is None:
        return False
    try:
        kr.set_password(SERVICE, url, key)
    except KeyringError as e:
        log.warning("cannot move the API key into the keyring (%s); it stays in settings.ini", e)
        return False
    settings.remove(FILE_SETTING)
    log.info("moved the API key of %s from settings.ini into the keyring", url)
    return True
