"""The models the app can offer: how a model is named on screen and found on disk (no Qt).

`discover` reads files (a model folder's config, GGUF headers), so the GUI runs it on a
background thread (`app.qt.jobs.in_thread`); it never touches MLX.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.models.named import NAMED_MODELS
from engine.models.resolve import DEMO_NAME, ModelEntry, discover_models


def model_label(spec: str) -> str:
    """The display name for what `Engine.load` takes: the demo, a file, a folder or an HF repo id."""
    if spec == "demo":
        return DEMO_NAME
    if spec in NAMED_MODELS:
        return NAMED_MODELS[spec].label
    p = Path(spec).expanduser()
    if p.exists():
        return p.stem if p.is_file() else p.name
    return spec  # an HF repo id


def entry_spec(entry: ModelEntry) -> str:
    """What Engine.load takes for a discovered model."""
    if entry.source == "demo":
        return "demo"
    if entry.spec:
        return entry.spec  # a named model (gemma3-270m): loaded by name
    if entry.source == "hf-cache":
        return entry.name  # org/name, resolved through the HF cache
    return str(entry.path)


def entry_name(entry: ModelEntry) -> str:
    return DEMO_NAME if entry.source == "demo" else entry.name


def discover(extra_dirs: list[str]) -> list[ModelEntry]:
    return discover_models([Path(d) for d in extra_dirs])


SOURCE_LABELS = {"hf-cache": "HF cache", "gguf": "imported GGUF", "folder": "folder", "demo": "built-in",
                 "named": "built-in"}


def source_label(entry: Any) -> str:
    return SOURCE_LABELS.get(entry.source, entry.source)
