"""Cache namespaces: whose snapshots a generation may restore and adds to.

The prompt cache looks snapshots up by key (memory and disk tiers alike) and never across keys.
A namespace is folded into that key, so a request in one namespace never restores, nor even
matches a prefix of, another namespace's snapshots: the cache report (matched, restored, source)
says nothing about what other clients sent. The app window's own conversations use no namespace
(the plain model key), as before; the local server gives each API key, and keyless API clients,
a namespace of their own (engine/serve/keys.py).
"""

from __future__ import annotations

import hashlib
from typing import Optional


def cache_key(model_key: str, namespace: Optional[str]) -> str:
    """The lookup key of `namespace`'s snapshots of the model `model_key` (None: the plain key).

    A hash of the namespace, not the namespace itself: keys derived from API keys end up in
    the disk index, and the disk format accepts only `[A-Za-z0-9_-]`.
    """
    if namespace is None:
        return model_key
    digest = hashlib.sha256(namespace.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    return f"{model_key}-ns-{digest}"


def is_key_of(model_key: str, key: str) -> bool:
    """Whether `key` is a lookup key of the model `model_key`: its plain key or a namespace's."""
    return key == model_key or key.startswith(f"{model_key}-ns-")
