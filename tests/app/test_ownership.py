"""Who may change what, checked on the source of app/:

- each sub-model of the chat (a class in app/core with typed signals: Conversation, Composer,
  Generation, EngineLink, ...) and the Chat that holds them own their fields: a field is assigned,
  augmented, mutated (`.append`, `[k] = `, `del`) or `setattr`-ed only as `self.<field>` inside a
  class, never through another object (`chat.conversation.vms = ...`, `self.chat.link.server = ...`);
- a signal is emitted only by the class that declares it (`self.<signal>.emit(...)` in that class),
  never from outside (`chat.generation.started.emit(...)`), for the app's Qt signals as well;
- nobody reaches a sub-model's private members from outside (`chat.generation._cancel`);
- the asyncio side reaches the engine thread only through engine/bridge.py (the one exception the
  bridge's docstring names: the server's admitted jobs).

Each check is a function over source text, and the last tests run them on planted violations.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Optional

from tests.ast_writes import MUTATORS, assigned, with_classes

ROOT = Path(__file__).resolve().parents[2]
# Modules that may hand jobs to the executor directly: the executor itself, the bridge, the
# server's admitted jobs (engine/serve/generation.py, which engine_routes.py uses too; the bridge's
# docstring says why) and `serve`'s start-up (it waits for the model to load before any asyncio
# loop exists: nothing to bridge).
EXECUTOR_USERS = {"engine/executor.py", "engine/bridge.py", "engine/serve/generation.py", "engine/cli/serve.py"}


def app_sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / "app").rglob("*.py"))}


def _is_signal(value: ast.expr) -> bool:
    """`Signal(...)`: a psygnal or a Qt signal declared on a class."""
    return isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] == "Signal"


def sub_models(sources: dict[str, str]) -> dict[str, tuple[set[str], set[str]]]:
    """The classes of app/core that declare signals, and Chat: name -> (fields, signals). A field
    is what the class assigns as `self.<name>` anywhere in it."""
    out: dict[str, tuple[set[str], set[str]]] = {}
    for path, src in sources.items():
        if not path.startswith("app/core/"):
            continue
        for cls in (n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ClassDef)):
            signals = {t.id for n in cls.body if isinstance(n, ast.Assign) and _is_signal(n.value)
                       for t in n.targets if isinstance(t, ast.Name)}  # fmt: skip
            if not signals and cls.name != "Chat":
                continue
            fields = {t.attr for n in ast.walk(cls) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))
                      for target in (n.targets if isinstance(n, ast.Assign) else [n.target])
                      for t in ast.walk(target) if isinstance(t, ast.Attribute) and _is_self(t.value)}  # fmt: skip
            out[cls.name] = (fields, signals)
    return out


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def _declared_signals(cls: Optional[ast.ClassDef]) -> set[str]:
    if cls is None:
        return set()
    return {t.id for n in cls.body if isinstance(n, ast.Assign) and _is_signal(n.value)
            for t in n.targets if isinstance(t, ast.Name)}  # fmt: skip


def _names(node: ast.expr) -> set[str]:
    """The names along an expression (`self.chat.link.server` -> self, chat, link, server)."""
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))}


def handles(tree: ast.AST, models: dict[str, tuple[set[str], set[str]]]) -> set[str]:
    """The names a module reaches sub-models by: `chat`, the Chat's own fields (conversation,
    composer, generation, link...), `attachments`, and any name assigned from an expression
    through one of them (`conv = chat.conversation`)."""
    names = {"chat", "attachments"} | models.get("Chat", (set(), set()))[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and _names(node.value) & names:
            names.add(node.targets[0].id)
    return names


def violations(source: str, models: dict[str, tuple[set[str], set[str]]]) -> list[str]:
    """Lines of `source` that write a sub-model's field from outside it, emit a signal from outside
    the class that declares it, or reach a sub-model's private member from outside. A write counts
    when it goes through a sub-model (see `handles`); a method call counts as a write when it
    mutates a container field (`.append`, `.pop`, ...) rather than calling a sub-model's own method."""
    tree = ast.parse(source)
    fields = set().union(*(f for f, _ in models.values()))
    sub = models.get("Chat", (set(), set()))[0] | {"attachments"}  # fields that hold sub-models
    private = {f for f in fields if f.startswith("_") and not f.startswith("__")}
    through = handles(tree, models)
    found: list[tuple[int, str]] = []

    def outside(t: ast.expr, call: bool = False) -> bool:
        while isinstance(t, ast.Subscript):  # x.f[k] = ...
            t = t.value
        return (isinstance(t, ast.Attribute) and t.attr in fields and not _is_self(t.value)
                and bool(_names(t.value) & through) and not (call and t.attr in sub))

    for node, cls in with_classes(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            if outside(node.func.value, call=True):
                found.append((node.lineno, "writes " + ast.unparse(node)[:80]))
        if any(outside(t) for t in assigned(node)):
            found.append((node.lineno, "writes " + ast.unparse(node)[:80]))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in fields \
                and not _is_self(node.args[0]):
            found.append((node.lineno, "writes " + ast.unparse(node)[:80]))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("emit", "emit_fast"):
            sig = node.func.value
            own = isinstance(sig, ast.Attribute) and _is_self(sig.value) and sig.attr in _declared_signals(cls)
            if not own:
                found.append((node.lineno, "emits " + ast.unparse(node)[:80]))
        if isinstance(node, ast.Attribute) and node.attr in private and not _is_self(node.value):
            found.append((node.lineno, "reaches " + ast.unparse(node)[:80]))
    return [f"{line}: {what}" for line, what in sorted(set(found))]


def test_sub_models_own_their_fields_and_signals() -> None:
    sources = app_sources()
    models = sub_models(sources)
    assert {"Chat", "Conversation", "ConversationList", "Composer", "Attachments", "Generation", "EngineLink",
            "ColdRuns", "Notices"} <= set(models)
    assert {"vms", "selected_id", "runs_shown"} <= models["Conversation"][0]
    assert {"pending", "stream", "replay", "_cancel"} <= models["Generation"][0]
    assert {"started", "ended", "streamed", "finished"} <= models["Generation"][1]
    assert {"server", "ready", "info"} <= models["EngineLink"][0]
    found = {path: v for path, src in sources.items() if (v := violations(src, models))}
    assert found == {}


def test_the_ownership_check_fails_on_planted_violations() -> None:
    models = sub_models(app_sources())
    planted = '''
from psygnal import Signal
chat.conversation.vms = []
w.chat.link.server = None
chat.conversation.runs_shown[3] = 1
chat.cold_runs.kept.pop(1)
chat.link.memory += 1
a, chat.composer.text = 1, "x"
setattr(chat.link, "ready", True)
chat.generation.started.emit(None)
chat.generation._cancel.cancel()
x = chat.link.info
chat.link.load("demo")
chat.conversation.select(3)
chat.composer.clear()
opt.text = ""
conv = chat.conversation
conv.selected_id = 4


class View:
    selected = Signal(int)

    def click(self) -> None:
        self.selected.emit(1)
        self.chat.notices.notice_changed.emit("")
        self.chat.generation.pending = None
        self.vms = []
'''
    lines = [v.split(":")[0] for v in violations(planted, models)]
    assert lines == ["3", "4", "5", "6", "7", "8", "9", "10", "11", "18", "26", "27"], violations(planted, models)


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
