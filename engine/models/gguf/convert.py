"""GGUF file -> mlx-lm model folder: architecture table, tensors one by one, tokenizer, template.

Everything cheap is validated before any tensor is read (architecture, tensor names and types,
config, tokenizer), so a bad file fails fast with one GGUFError line. Tensors are then converted
one at a time from the mapped file (see tensors.py) and written into a temp folder that is
renamed into place, so a crash or a cancel never leaves a half-written model behind.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

import numpy as np

from engine.errors import GGUFError
from engine.models.gguf.arch import (
    build_config,
    expected_shape,
    get_arch,
    mlx_name,
    required_tensors,
)
from engine.models.gguf.reader import GGUFFile, read_gguf
from engine.models.gguf.tensors import convert_tensor, plan, supported
from engine.models.gguf.tokenizer import build_tokenizer
from engine.types import CancelToken, Progress

CONVERTER_VERSION = 2  # bump when the produced folder changes: old imports are redone
SHARD_BYTES = 1 << 30


def _check_cancel(cancel: Optional[CancelToken]) -> None:
    if cancel is not None:
        cancel.check("import cancelled")


def chat_template(g: GGUFFile) -> tuple[str, str]:
    """(source, Jinja): the file's own template ("file"), else the architecture's built-in one
    ("builtin:<name>")."""
    own = g.metadata.get("tokenizer.chat_template")
    if isinstance(own, str) and own.strip():
        return "file", own
    label, template = get_arch(g.architecture).chat_template
    return f"builtin:{label}", template


def _model_name(g: GGUFFile) -> str:
    name = g.metadata.get("general.name")
    return name if isinstance(name, str) and name.strip() else g.path.stem


def convert(path: Path | str, out_dir: Path | str, progress: Optional[Progress] = None,
            cancel: Optional[CancelToken] = None, info: Optional[GGUFFile] = None) -> Path:
    """Convert a GGUF into an mlx-lm folder at `out_dir` (which must not exist yet)."""
    report = progress or (lambda f, m: None)
    out_dir = Path(out_dir)
    g = info or read_gguf(path)
    arch = get_arch(g.architecture)
    bad = sorted({t.type_name for t in g.tensors.values() if not supported(t.ggml_type)})
    if bad:
        raise GGUFError(f"unsupported tensor type(s) {', '.join(bad)} (supported: every type gguf-py can dequantize)")
    config = build_config(arch, g.metadata, set(g.tensors))
    n_layers = config["num_hidden_layers"]
    names = {t.name: mlx_name(arch, t.name, n_layers) for t in g.tensors.values()}
    for required in required_tensors(arch, n_layers):
        if required not in g.tensors:
            raise GGUFError(f"missing tensor {required!r} (a {n_layers}-block {arch.name} model needs it)")
    for t in g.tensors.values():  # a wrong size would only fail later, when mlx-lm loads the folder
        want = expected_shape(names[t.name][0], config)
        if t.shape != want:
            raise GGUFError(f"tensor {t.name!r} has shape {list(t.shape)}, expected {list(want)} from the metadata")
    template_source, template = chat_template(g)
    tokenizer, tok_config = build_tokenizer(g.metadata, config["max_position_embeddings"], template)
    _check_cancel(cancel)

    weights: dict[str, Any] = {}
    per_module: dict[str, int] = {}  # quantized module path -> bits
    bits_bytes: dict[int, int] = {}
    how_by_type: dict[str, set[str]] = {}
    shift = arch.norm_shift
    total = max(sum(t.nbytes for t in g.tensors.values()), 1)
    done = 0
    with open(g.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        for t in g.tensors.values():
            _check_cancel(cancel)
            report(0.05 + 0.75 * done / total, f"converting {t.name}")
            target_name, is_norm = names[t.name]
            keep_float = is_norm or target_name.endswith(".bias")
            target = plan(t.ggml_type, t.shape, keep_float)
            transform = (lambda w: w + shift) if (is_norm and shift) else None
            raw = np.frombuffer(mm, np.uint8, t.nbytes, t.offset)
            bad = None
            try:
                arrays, how = convert_tensor(raw, t.ggml_type, t.shape, target, transform,
                                             lambda: _check_cancel(cancel))
            except GGUFError as e:
                bad = str(e)  # raised below, once the traceback's views of the mapping are gone
            del raw
            if bad is not None:
                raise GGUFError(f"tensor {t.name!r} ({t.type_name}): {bad}")
            module = target_name.rpartition(".")[0]
            if "scales" in arrays:
                bits = target.bits if how == "exact" else 8
                per_module[module] = bits
                bits_bytes[bits] = bits_bytes.get(bits, 0) + t.nbytes
                weights.update({f"{module}.weight": arrays["weight"], f"{module}.scales": arrays["scales"],
                                f"{module}.biases": arrays["biases"]})
                how = f"{bits}-bit {how}"
            else:
                weights[target_name] = arrays["weight"]
                how = f"{arrays['weight'].dtype}".removeprefix("mlx.core.") + (" (shifted)" if transform else "")
            how_by_type.setdefault(t.type_name, set()).add(how)
            done += t.nbytes
    if per_module:
        # the most common bit width is the default; the others are named per module
        default = max(bits_bytes, key=lambda k: bits_bytes[k])
        quant: dict[str, Any] = {"group_size": 32, "bits": default}
        quant.update({k: {"group_size": 32, "bits": b} for k, b in per_module.items() if b != default})
        config["quantization"] = quant
        config["quantization_config"] = quant
    md = g.metadata
    eos = [i for i in (md.get("tokenizer.ggml.eos_token_id"), md.get("tokenizer.ggml.eot_token_id"))
           if isinstance(i, int) and 0 <= i < config["vocab_size"]]
    if template_source == "builtin:gemma":
        eos.append(_token_id(md, "<end_of_turn>"))
    eos = [i for i in eos if i is not None]
    if eos:
        config["eos_token_id"] = eos[0] if len(set(eos)) == 1 else sorted(set(eos))
    if isinstance(md.get("tokenizer.ggml.bos_token_id"), int):
        config["bos_token_id"] = md["tokenizer.ggml.bos_token_id"]
    # what the import decided, in config.json so it is part of the model key
    config["verbatim_gguf"] = {
        "converter_version": CONVERTER_VERSION,
        "architecture": arch.name,
        "chat_template": template_source,
        "tensors": {k: sorted(v) for k, v in sorted(how_by_type.items())},
    }
    _check_cancel(cancel)
    _write(Path(path), g, out_dir, weights, tokenizer, tok_config, config, report, cancel)
    report(1.0, "done")
    return out_dir


def _token_id(md: dict[str, Any], token: str) -> Optional[int]:
    tokens = md.get("tokenizer.ggml.tokens") or []
    try:
        return tokens.index(token)
    except ValueError:
        return None


def _write(path: Path, g: GGUFFile, out_dir: Path, weights: dict[str, Any], tokenizer: Any,
           tok_config: dict[str, Any], config: dict[str, Any], report: Progress, cancel: Optional[CancelToken]) -> None:
    import mlx.core as mx

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the model folder is not secret
        shards = _shards(weights, SHARD_BYTES)
        index: dict[str, str] = {}
        for i, shard in enumerate(shards):
            _check_cancel(cancel)
            report(0.8 + 0.12 * i / len(shards), f"writing weights ({i + 1}/{len(shards)})")
            fname = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            mx.save_safetensors(str(tmp / fname), shard, metadata={"format": "mlx"})
            index.update({k: fname for k in shard})
        if len(shards) > 1:
            (tmp / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}, indent=1))
        report(0.93, "writing tokenizer")
        tokenizer.save(str(tmp / "tokenizer.json"))
        (tmp / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        (tmp / "verbatim_import.json").write_text(json.dumps({
            "source": str(path.resolve()),
            "name": _model_name(g),
            "converter_version": CONVERTER_VERSION,
            "gguf_version": g.version,
            "tensor_types": sorted({t.type_name for t in g.tensors.values()}),
            "chat_template": config["verbatim_gguf"]["chat_template"],
        }, indent=2))
        _check_cancel(cancel)
        try:
            os.replace(tmp, out_dir)  # atomic: the folder appears complete or not at all
        except OSError:
            if not (out_dir / "config.json").is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # a concurrent import of the same file won
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _shards(weights: dict[str, Any], max_bytes: int) -> list[dict[str, Any]]:
    shards: list[dict[str, Any]] = [{}]
    size = 0
    for k, v in weights.items():
        if size and size + v.nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = v
        size += v.nbytes
    return shards


# --- cached import ---

def import_gguf(path: Path | str, models_dir: Path | str, progress: Optional[Progress] = None,
                cancel: Optional[CancelToken] = None) -> Path:
    """Import `path` into `models_dir/<content hash>/`, converting only the first time.

    The folder name is the file's SHA-256 (plus the converter version), so the same file under
    another name or path reuses the import, and a changed file gets a new one.
    """
    from engine.models.key import (
        cached_file_hash,  # stat-keyed hash memo shared with model keys
    )

    path = Path(path)
    report = progress or (lambda f, m: None)
    if not path.is_file():
        raise GGUFError(f"no such file: {path}")
    info = read_gguf(path)  # cheap, and rejects garbage before we spend time hashing it
    report(0.0, "hashing")
    digest = cached_file_hash(path, lambda f, m: report(0.3 * f, m), cancel)
    out = Path(models_dir) / f"{digest[:24]}-v{CONVERTER_VERSION}"
    if (out / "config.json").is_file():
        report(1.0, IMPORTED_BEFORE)
        return out
    return convert(path, out, lambda f, m: report(0.3 + 0.7 * f, m), cancel, info)


IMPORTED_BEFORE = "imported before: using the converted copy"  # this file's content was converted already


def model_config(g: GGUFFile) -> dict[str, Any]:
    """The mlx-lm config a file would convert to (validates architecture and metadata only)."""
    return build_config(get_arch(g.architecture), g.metadata, set(g.tensors))
