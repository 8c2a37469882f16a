"""A keyring backend for the tests: keys in a JSON file (never the user's Keychain or Secret
Service). tests/conftest.py makes one the keyring of every test session; the `file_keyring`
fixture gives a test its own, in its tmp_path, to read back what the app stored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from keyring.backend import KeyringBackend
from keyring.errors import PasswordDeleteError


class _NotViable:
    """A `priority` that raises: keyring's own discovery never picks (or instantiates) this
    backend; it is only ever set explicitly (keyring.set_keyring)."""

    def __get__(self, obj: object, cls: type) -> float:
        raise RuntimeError("tests only: chosen with keyring.set_keyring")


class FileKeyring(KeyringBackend):
    priority = _NotViable()  # type: ignore[assignment]

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = Path(path)

    def items(self) -> dict[str, dict[str, str]]:
        """{service: {username: password}} as stored."""
        return json.loads(self.path.read_text(encoding="utf-8")) if self.path.exists() else {}

    def _write(self, items: dict[str, dict[str, str]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(items), encoding="utf-8")

    def get_password(self, service: str, username: str) -> Optional[str]:
        return self.items().get(service, {}).get(username)

    def set_password(self, service: str, username: str, password: str) -> None:
        items = self.items()
        items.setdefault(service, {})[username] = password
        self._write(items)

    def delete_password(self, service: str, username: str) -> None:
        items = self.items()
        if username not in items.get(service, {}):
            raise PasswordDeleteError(f"no password for {username!r} in {service!r}")
        del items[service][username]
        self._write(items)
