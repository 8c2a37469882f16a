"""The prompt cache tests' fixtures. Their models are the shared ones (tests/conftest.py:
`models`, `llama`); what they read from a cache folder is tests/disk_helpers.py."""

from __future__ import annotations

import pytest


@pytest.fixture
def hash_memo_in_basetemp(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """$VERBATIM_CACHE_DIR (where model_key memoizes file hashes) under this run's base temp."""
    monkeypatch.setenv("VERBATIM_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "memo"))
