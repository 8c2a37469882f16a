"""Who may change what in the disk tier (engine/cache/disk/), checked on the source and at run
time: every field of the store, the index, the write queue, the pack files and the report is
written by its own class only; the index changes only in its owner (the store) and in folder.py,
which builds a fresh one; the writer thread's side of the queue and the store's writer-thread work
are called from store.py only; the queue knows nothing of the store; the store's fields that two
threads meet on are written under its lock; and what the index shares with its views is frozen.
A planted outside writer (the ones this layout replaced) is found."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Iterator, Optional

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache

from engine.cache.disk.index import Index
from engine.cache.disk.tier import DiskCache
from engine.cache.kinds import SnapshotKind
from engine.cache.meta import SnapshotMeta
from engine.cache.snapshot import Snapshot, cache_nbytes, clone_cache, new_snapshot_id
from tests.ast_writes import MUTATORS, assigned, with_classes

ROOT = Path(__file__).resolve().parents[2]
DISK = ROOT / "engine/cache/disk"
# How the code names each object it may hold -> (the class, the module that defines it). A write
# to `<name>.field` (or `<expr>.<name>.field`) from anywhere but that class's own methods (`self`)
# is an outside writer; `counts` is the report's, written only by `Report`.
OWNED = {
    "store": ("DiskStore", "store.py"),
    "index": ("Index", "index.py"),
    "view": ("IndexView", "index.py"),
    "queue": ("WriteQueue", "writer.py"),
    "writer": ("WriteQueue", "writer.py"),
    "files": ("PackFiles", "packfiles.py"),
    "report": ("Report", "report.py"),
    "counts": ("Counters", "report.py"),
}
WRITTEN_BY = {"Counters": "Report"}
# Methods that change the index: its owner (store.py) calls them, and folder.py on an index it is
# building (before the owner has it).
INDEX_CHANGES = {"add_pack", "add", "drop", "touch", "clear", "collect", "victims"}
INDEX_CHANGERS = {"store.py", "folder.py", "index.py"}
# The writer thread's own work: only the store's thread does it (store.py).
STORE_WRITER_WORK = {"do", "save", "clear", "evict", "collect", "write_index", "trim_tails", "failed", "_run"}
QUEUE_TAKER_SIDE = {"taken_by", "next_task", "task_done", "queued_saves", "queue_empty", "discard_all",
                    "sync_at", "begin_write", "end_write"}


def _fields(cls: ast.ClassDef) -> set[str]:
    """A class's attributes: `self.x` assigned in its methods, annotated class fields, properties."""
    out = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
        if any(isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list):
            out.add(fn.name)
        for node in ast.walk(fn):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else []
            for t in targets:
                for a in ast.walk(t):
                    if isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name) and a.value.id == "self":
                        out.add(a.attr)
    return out


def owned_fields() -> dict[str, set[str]]:
    """Each owned class's attributes, read from its module."""
    out: dict[str, set[str]] = {}
    for cls_name, module in set(OWNED.values()):
        tree = ast.parse((DISK / module).read_text())
        classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        out[cls_name] = _fields(classes[cls_name])
        for base in classes[cls_name].bases:  # IndexTables' tables are Index's and IndexView's too
            if isinstance(base, ast.Name) and base.id in classes:
                out[cls_name] |= _fields(classes[base.id])
    return out


def _chain(node: ast.expr) -> list[str]:
    """The names along `a.b.c` (["a", "b", "c"]); calls and subscripts pass through."""
    out: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            out.append(node.attr)
            node = node.value
        elif isinstance(node, (ast.Call, ast.Subscript)):
            node = node.func if isinstance(node, ast.Call) else node.value
        elif isinstance(node, ast.Name):
            out.append(node.id)
            return out[::-1]
        else:
            return out[::-1]


def _named(node: ast.expr, inside: bool) -> Optional[str]:
    """The owned name an expression is held by: `store`, `self.store`; outside the disk package
    only through a disk tier (`cache.disk.store`: elsewhere `report` is a CacheReport)."""
    chain = _chain(node)
    if not chain or chain[-1] not in OWNED:
        return None
    return chain[-1] if inside or "disk" in chain[:-1] else None


def outside_writers(source: str, module: str, fields: dict[str, set[str]]) -> list[str]:
    """Lines of `source` (the module `module`, a path under engine/cache/disk/ or any other) that
    write a field of an owned object from outside its class, change the index outside its owner,
    or do the writer thread's work outside store.py."""
    found: list[tuple[int, str]] = []
    inside = module.startswith("engine/cache/disk/")
    name = module.rsplit("/", 1)[-1] if inside else module
    for node, in_class in with_classes(ast.parse(source)):
        cls = in_class.name if in_class is not None else None
        targets = assigned(node)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method, holder = node.func.attr, _named(node.func.value, inside)
            if method in MUTATORS and isinstance(node.func.value, ast.Attribute):
                targets = [node.func.value]  # report.warnings.append(...)
            if holder == "index" and method in INDEX_CHANGES and name not in INDEX_CHANGERS:
                found.append((node.lineno, ast.unparse(node)[:90]))
            if holder == "store" and method in STORE_WRITER_WORK and name != "store.py":
                found.append((node.lineno, ast.unparse(node)[:90]))
            if holder in ("queue", "writer") and method in QUEUE_TAKER_SIDE and name != "store.py":
                found.append((node.lineno, ast.unparse(node)[:90]))
        for t in targets:
            while isinstance(t, ast.Subscript):
                t = t.value
            if not isinstance(t, ast.Attribute):
                continue
            holder = _named(t.value, inside)
            if holder is None:
                continue
            owner = OWNED[holder][0]
            if t.attr in fields[owner] and (owner not in WRITTEN_BY or cls != WRITTEN_BY[owner]):
                found.append((node.lineno, ast.unparse(node)[:90]))
    return [f"{line}: {text}" for line, text in sorted(set(found))]


def engine_modules() -> Iterator[tuple[str, str]]:
    for p in sorted((ROOT / "engine").rglob("*.py")):
        yield str(p.relative_to(ROOT)), p.read_text()


def test_every_disk_tier_field_is_written_by_its_own_class_only() -> None:
    fields = owned_fields()
    assert {"index", "clears", "_writable", "view", "dirty", "writable"} <= fields["DiskStore"]
    assert {"packs", "block_locs", "_entries", "_users"} <= fields["Index"]
    assert {"rejected", "index_reloads"} <= fields["Counters"] and "on_warning" in fields["Report"]
    assert {"hooks", "_queue", "_holds"} <= fields["WriteQueue"] and "hooks" in fields["PackFiles"]
    found = {m: w for m, src in engine_modules() if (w := outside_writers(src, m, fields))}
    assert found == {}


# The outside writers this layout replaced (tier.py and store.py before it), planted back.
PLANTED = """\
class DiskCache:
    def clear(self):
        self.store.clears = self._clears
        self.store.replace_index(Index(self.env), False)

    def poll(self):
        self.store.writable, self.took_over, self.read_only_reason = True, True, None

    def _open_index(self, read, index):
        self.report.counts.rejected = read.rejected
        index.collect()

    @hooks.setter
    def hooks(self, hooks):
        self.files.hooks = self.writer.hooks = hooks

    def listen(self, fn):
        self.report.on_warning = fn
        self.report.warnings.append("x")

    def _do(self, task):
        self.store.do(task)
        self.queue.next_task()
        self.store.index.drop("a")
        self.store.view = None
"""


def test_a_planted_outside_writer_is_found() -> None:
    found = outside_writers(PLANTED, "engine/cache/disk/tier.py", owned_fields())
    assert [line.split(":")[0] for line in found] == ["3", "7", "10", "11", "15", "18", "19", "22", "23", "24", "25"]
    # and the same line planted into the real front is found there
    tier = (DISK / "tier.py").read_text()
    planted = tier.replace("        self.took_over, self.read_only_reason = True, None\n",
                           "        self.took_over, self.read_only_reason = True, None\n"
                           "                self.store.writable = True\n", 1)
    assert planted != tier
    assert [w.split(": ", 1)[1] for w in outside_writers(planted, "engine/cache/disk/tier.py", owned_fields())] == [
        "self.store.writable = True"]
    # outside the package, through the engine's disk tier (a CacheReport named `report` is no Report)
    engine_src = "def f(self, result):\n    result.report.warnings = []\n    self.cache.disk.store.writable = True\n"
    assert outside_writers(engine_src, "engine/engine.py", owned_fields()) == ["3: self.cache.disk.store.writable = True"]
    # a class writing its own fields, and the report counting into its own counters, are no outside writers
    assert outside_writers("class Report:\n    def f(self):\n        self.counts.rejected = 1\n"
                           "        self.warnings.append('x')\n", "engine/cache/disk/report.py", owned_fields()) == []


def test_the_queue_calls_nothing_of_the_store() -> None:
    """writer.py hands out tasks and answers; the store takes them: no name of the store there."""
    tree = ast.parse((DISK / "writer.py").read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    imports = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not names & {"store", "DiskStore", "do", "save"} and "engine.cache.disk.store" not in imports
    init = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    assert [a.arg for a in init.args.args] == ["self", "hooks", "max_pending_bytes"]  # no callback


def _locked_writes(fn: ast.FunctionDef, shared: set[str]) -> list[tuple[str, bool]]:
    """(field, under `with self._lock`) for every write of a `shared` field of self in `fn`."""
    out: list[tuple[str, bool]] = []

    def walk(node: ast.AST, locked: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = locked or (isinstance(child, ast.With) and any(
                ast.unparse(item.context_expr) == "self._lock" for item in child.items))
            targets = child.targets if isinstance(child, ast.Assign) else [child.target] if isinstance(
                child, ast.AugAssign) else []
            for t in targets:
                for a in ast.walk(t):
                    if isinstance(a, ast.Attribute) and ast.unparse(a.value) == "self" and a.attr in shared:
                        out.append((a.attr, inner))
            walk(child, inner)

    walk(fn, False)
    return out


def test_the_stores_shared_fields_are_written_under_its_lock() -> None:
    """The role (`_writable`) and the index with its clear count and view: two threads write them
    (the writer thread publishes and fails, the engine thread takes over and clears a reader), so
    every write outside __init__ holds the store's lock."""
    tree = ast.parse((DISK / "store.py").read_text())
    store = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DiskStore")
    writes = [(fn.name, f, locked) for fn in store.body if isinstance(fn, ast.FunctionDef) and fn.name != "__init__"
              for f, locked in _locked_writes(fn, {"_writable", "index", "clears", "view"})]
    assert {f for _, f, _ in writes} == {"_writable", "index", "clears", "view"}
    assert [w for w in writes if not w[2]] == []
    planted = ast.parse("def f(self):\n    self.clears += 1\n    with self._lock:\n        self.view = 1\n").body[0]
    assert _locked_writes(planted, {"clears", "view"}) == [("clears", False), ("view", True)]  # type: ignore[arg-type]


def _snapshot(n: int = 16, first: int = 0) -> Snapshot:
    kv = KVCache()
    kv.update_and_fetch(mx.ones((1, 2, n, 8)) * first, mx.ones((1, 2, n, 8)))
    cache = clone_cache([kv])
    meta = SnapshotMeta(new_snapshot_id(), "k" * 32, tuple(range(first, first + n)), SnapshotKind.END, (8, n),
                        ("KVCache",), True, cache_nbytes(cache), forwards=((0, 8), (8, n)), block_ends=(8, n))
    return Snapshot(meta, cache)


def test_what_the_index_shares_with_its_views_is_frozen_and_a_use_replaces_the_entry(tmp_path: Path) -> None:
    disk = DiskCache(tmp_path / "cache", budget_bytes=1 << 30)
    snap = _snapshot()
    disk.save_async(snap)
    assert disk.flush(30)
    before = disk.store.view
    entry = before.get(snap.meta.id)
    assert entry is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.last_used = 0.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        next(iter(before.packs.values())).sha256 = ""  # type: ignore[misc]
    with pytest.raises(AttributeError):
        before.clears = 5  # type: ignore[misc]
    disk.load(snap.meta)  # a use: the writer replaces the entry, the view read before keeps its copy
    assert disk.flush(30)
    after = disk.store.view.get(snap.meta.id)
    assert after is not None and after is not entry and after.last_used >= entry.last_used
    assert before.get(snap.meta.id) is entry and disk.last_used(snap.meta.id) == after.last_used
    disk.close()


def test_a_reader_forgets_on_clear_through_the_store_and_the_view_follows(tmp_path: Path) -> None:
    writer = DiskCache(tmp_path / "cache", budget_bytes=1 << 30)
    snap = _snapshot()
    writer.save_async(snap)
    assert writer.flush(30)
    reader = DiskCache(tmp_path / "cache", budget_bytes=1 << 30)
    assert not reader.writable and [m.id for m in reader.entries("k" * 32)] == [snap.meta.id]
    reader.clear()  # no writer thread here: the store forgets it on this thread
    assert reader.entries("k" * 32) == [] and reader.store.clears == 1 == reader.store.view.clears
    assert len(reader.store.index) == 0 and isinstance(reader.store.index, Index)
    assert [m.id for m in writer.entries("k" * 32)] == [snap.meta.id]  # the files are the writer's
    reader.close()
    writer.close()
