"""Download an MLX model repo from the Hugging Face hub into the standard HF cache.

Only what mlx-lm needs (config/tokenizer JSON and safetensors) is fetched: no pickles, no code.
Progress comes from huggingface_hub's tqdm hook (bytes and files), and the same hook checks the
cancel token, so a cancel stops the download at the next reported chunk.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Optional

from engine.errors import Cancelled, ModelError
from engine.models.resolve import check_folder
from engine.types import CancelToken, Progress

ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model", "*.tiktoken", "*.txt"]


def _tqdm_class(progress: Optional[Progress], cancel: Optional[CancelToken]) -> Any:
    from tqdm.auto import tqdm

    best = [0.0]

    class Hook(tqdm):  # type: ignore[misc]
        """huggingface_hub's file-count bar, turned into progress callbacks and cancel checks."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = False  # a disabled tqdm stops counting; we silence its output instead
            kwargs["file"] = io.StringIO()
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            if cancel is not None:
                cancel.check("download cancelled")
            out = super().update(n)
            total = getattr(self, "total", None)
            if progress and total:
                done = getattr(self, "n", 0)
                if getattr(self, "unit", "") == "B":  # the aggregate byte bar
                    what = f"{done / 1e6:.1f}/{total / 1e6:.1f} MB"
                else:
                    what = f"{int(done)}/{int(total)} files"
                # two bars (bytes, files) report here: keep the fraction monotonic for the UI
                best[0] = max(best[0], min(done / total, 1.0))
                progress(best[0], f"downloaded {what}")
            return out

    return Hook


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Connection-level error classes of whichever HTTP client huggingface_hub uses."""
    import importlib

    found: list[type[BaseException]] = []
    for mod in ("httpx2", "httpx", "requests"):
        try:
            m = importlib.import_module(mod)
        except ImportError:
            continue
        for attr in ("TransportError", "ConnectionError", "Timeout"):
            cls = getattr(m, attr, None)
            if isinstance(cls, type) and issubclass(cls, BaseException):
                found.append(cls)
    return tuple(found)


def download_model(repo_id: str, progress: Optional[Progress] = None, cancel: Optional[CancelToken] = None,
                   revision: Optional[str] = None, cache_dir: Optional[Path] = None,
                   endpoint: Optional[str] = None) -> Path:
    """Fetch `org/name` (MLX format) and return its snapshot folder; ModelError on failure.

    `endpoint` defaults to $HF_ENDPOINT read now (huggingface_hub reads it once, at import).
    """
    import os

    from huggingface_hub import errors as hf_errors
    from huggingface_hub import snapshot_download

    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ModelError(f"not a Hugging Face repo id (expected org/name): {repo_id!r}")
    if cancel is not None:
        cancel.check("download cancelled")
    if progress:
        progress(0.0, f"downloading {repo_id}")
    try:
        folder = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=cache_dir,
            allow_patterns=ALLOW_PATTERNS,
            endpoint=endpoint or os.environ.get("HF_ENDPOINT") or None,
            tqdm_class=_tqdm_class(progress, cancel),
        )
    except Cancelled:
        raise
    except hf_errors.GatedRepoError:
        raise ModelError(f"{repo_id} is gated: accept its license on huggingface.co and log in (hf auth login)") from None
    except hf_errors.RepositoryNotFoundError:
        raise ModelError(f"repository {repo_id} not found on the Hugging Face hub") from None
    except hf_errors.RevisionNotFoundError:
        raise ModelError(f"revision {revision!r} not found in {repo_id}") from None
    except (hf_errors.LocalEntryNotFoundError, hf_errors.OfflineModeIsEnabled, *_transport_errors(), OSError) as e:
        # offline (no route, DNS, proxy, HF_HUB_OFFLINE) and nothing cached to fall back on
        root = e.__cause__ or e
        msg = (str(root).strip().splitlines() or [""])[0].removeprefix("Got: ")
        msg = f"{type(root).__name__}: {msg}" if msg else type(root).__name__
        raise ModelError(f"cannot reach the Hugging Face hub: {msg}") from None
    except hf_errors.HfHubHTTPError as e:
        raise ModelError(f"the Hugging Face hub refused {repo_id}: {str(e).splitlines()[0]}") from None
    folder = Path(folder)
    try:
        check_folder(folder)
    except ModelError as e:
        raise ModelError(f"{repo_id} is not an MLX model repo: {e}") from None
    if progress:
        progress(1.0, "done")
    return folder
