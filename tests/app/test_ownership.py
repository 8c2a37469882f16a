"""Who may change what, checked on the source: the chat model's fields are written by its own
methods only (so every writer of a field is found in app/core/chat.py), and the asyncio side
reaches the engine thread only through engine/bridge.py (the one exception the bridge's
docstring names: the server's admitted jobs)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MUTATORS = {"append", "extend", "insert", "pop", "popitem", "clear", "update", "setdefault", "remove",
            "add", "discard"}
# Modules that may hand jobs to the executor directly: the executor itself, the bridge, the
# server's admitted jobs (the bridge's docstring says why) and `serve`'s start-up (it waits for
# the model to load before any asyncio loop exists: nothing to bridge).
EXECUTOR_USERS = {"engine/executor.py", "engine/bridge.py", "engine/serve/engine_routes.py", "engine/cli/serve.py"}


def _chat_fields() -> set[str]:
    tree = ast.parse((ROOT / "app/core/chat.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ChatModel")
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    return {t.attr for n in ast.walk(init) if isinstance(n, (ast.Assign, ast.AnnAssign))
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            for t in ast.walk(t) if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
            and t.value.id == "self"}


def _is_chat(node: ast.expr) -> bool:
    """`chat`, `self.chat`, `w.chat`: how the app names its ChatModel."""
    return (isinstance(node, ast.Name) and node.id == "chat") or (isinstance(node, ast.Attribute) and node.attr == "chat")


def chat_writes(source: str, fields: set[str]) -> list[str]:
    """Lines of `source` that assign, augment or mutate a chat model field from outside."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            targets = [node.func.value]
        while targets:
            t = targets.pop()
            if isinstance(t, (ast.Tuple, ast.List)):  # a, chat.x = ...
                targets.extend(t.elts)
                continue
            while isinstance(t, ast.Subscript):  # chat.x[k] = ...
                t = t.value
            if isinstance(t, ast.Attribute) and t.attr in fields and _is_chat(t.value):
                found.append((node.lineno, ast.unparse(node)[:80]))
    return [f"{line}: {text}" for line, text in sorted(found)]


def test_chat_model_fields_are_written_by_its_methods_only() -> None:
    fields = _chat_fields()
    assert {"model_ready", "model_info", "link", "verifying", "cold_runs", "fallback_spec"} <= fields
    writes = {str(p.relative_to(ROOT)): w for p in sorted((ROOT / "app").rglob("*.py"))
              if p != ROOT / "app/core/chat.py" and (w := chat_writes(p.read_text(), fields))}
    assert writes == {}


def test_the_writer_check_can_fail() -> None:
    fields = _chat_fields()
    src = ("chat.model_ready = True\nw.chat.link = None\nself.chat.cold_runs.pop(1)\n"
           "chat.runs_shown[3] = 1\nchat.verifying |= False\nx = chat.model_info\nchat.set_verifying(True)\n"
           "a, chat.model_spec = 1, 2\n")
    assert [line.split(":")[0] for line in chat_writes(src, fields)] == ["1", "2", "3", "4", "5", "8"]


def test_the_loop_reaches_the_engine_thread_through_the_bridge() -> None:
    direct = []
    for p in sorted([*(ROOT / "app").rglob("*.py"), *(ROOT / "engine").rglob("*.py")]):
        rel = str(p.relative_to(ROOT))
        if rel in EXECUTOR_USERS:
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in {"submit", "swap"} and "executor" in ast.unparse(node.func.value):
                direct.append(f"{rel}:{node.lineno}: {ast.unparse(node)[:70]}")
    assert direct == []
