"""API keys and the prompt-cache namespace each request uses.

Each API key is its own cache namespace: clients holding different keys never restore, nor
learn anything about, each other's snapshots (engine/cache/namespace.py). Without keys, every
API client shares one namespace, `API_NAMESPACE`, which is not the app window's (None): the
window's conversations are reachable from the server only when the user turns on sharing.

Keys come from `--api-key` (repeatable, or $VERBATIM_API_KEY) or `--api-keys-file` (one key per
line; keeps them out of `ps`). A key is checked from the request's headers, before its body is read.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Optional

from engine.serve.schema import APIError

API_NAMESPACE = "api"  # keyless API clients, all together (never the window's None)


class KeyFileError(ValueError):
    """An --api-keys-file that cannot be used (missing, unreadable, no keys)."""


def read_keys_file(path: Path) -> list[str]:
    """One key per line; blank lines and lines starting with '#' are skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise KeyFileError(f"cannot read the API keys file {path}: {e}") from e
    keys = [line.strip() for line in text.splitlines()]
    keys = [k for k in keys if k and not k.startswith("#")]
    if not keys:
        raise KeyFileError(f"the API keys file {path} holds no keys")
    bad = [i for i, k in enumerate(keys, 1) if any(c.isspace() for c in k)]
    if bad:
        raise KeyFileError(f"the API keys file {path}: line {bad[0]} holds whitespace inside a key")
    return keys


@dataclass(frozen=True)
class Keys:
    """The keys a server accepts (none: no key needed) and whose window cache it may share."""

    keys: tuple[str, ...] = ()
    share_window: bool = False  # keyless API clients use the window's own namespace

    @classmethod
    def of(cls, keys: Iterable[str] | str | None = (), share_window: bool = False) -> "Keys":
        if isinstance(keys, str):  # one key, not its characters
            keys = [keys]
        return cls(tuple(dict.fromkeys(k for k in keys or () if k)), share_window)

    @property
    def required(self) -> bool:
        return bool(self.keys)

    def namespace(self, headers: Mapping[str, str]) -> Optional[str]:
        """The request's cache namespace; APIError 401 when a key is required and missing or wrong.
        Every key is compared in constant time (the position of a match does not show)."""
        if not self.keys:
            return None if self.share_window else API_NAMESPACE
        got = headers.get("Authorization", "")
        scheme, _, token = got.partition(" ")
        if not got and "x-api-key" in headers:  # Anthropic's clients send their key so
            scheme, token = "bearer", headers["x-api-key"]
        token_b = token.strip().encode("utf-8", "surrogateescape")
        match: Optional[str] = None
        for key in self.keys:
            if hmac.compare_digest(token_b, key.encode("utf-8", "surrogateescape")):
                match = key
        if scheme.lower() != "bearer" or match is None:
            raise APIError(401, "missing or wrong API key (send 'Authorization: Bearer <key>' or 'x-api-key: <key>')",
                           code="invalid_api_key")
        # Derived from the key, never the key itself (it ends up, hashed again, in the disk index).
        return "key:" + hashlib.sha256(match.encode("utf-8", "surrogateescape")).hexdigest()
