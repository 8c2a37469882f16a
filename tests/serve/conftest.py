"""The server tests' fixtures: `server`, an in-process server on the tiny llama with a memory
cache only (tests/server_helpers.Server). Servers with other models or options (a disk cache,
API keys, the tool model, allowed origins) are their modules' own fixtures; what tests send a
server is tests/server_helpers.py and tests/raw_http.py."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.server_helpers import Server


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[Server]:
    s = Server(tiny_model, None)
    yield s
    s.close()
