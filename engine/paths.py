"""Where Verbatim keeps things on disk: the only module that asks platformdirs.

| what                              | where                                                      |
|-----------------------------------|------------------------------------------------------------|
| conversations, settings           | `data_dir()`: platformdirs user data dir                   |
| prompt cache, imported GGUFs,     | `cache_root()`: platformdirs user cache dir, or            |
| file-hash memo                    | `$VERBATIM_CACHE_DIR` (read at call time: tests change it) |
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "Verbatim"


def data_dir() -> Path:
    """Conversations and settings (backed up with the user's documents)."""
    return Path(platformdirs.user_data_dir(APP_NAME))


def documents_dir() -> Path:
    """Where file dialogs start the first time (exports, receipts, imports): the user's documents."""
    return Path(platformdirs.user_documents_dir())


def cache_root() -> Path:
    """Everything that can be rebuilt: $VERBATIM_CACHE_DIR, else the platform user cache dir."""
    env = os.environ.get("VERBATIM_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_cache_dir(APP_NAME))


def prompt_cache_dir() -> Path:
    """The prompt cache's disk tier."""
    return cache_root() / "prompt-cache"


def models_dir() -> Path:
    """Imported GGUF models, one folder per content hash."""
    return cache_root() / "models"
