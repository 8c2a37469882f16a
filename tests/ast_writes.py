"""What the ownership checks read in a module's syntax tree (tests/app/test_ownership.py,
tests/cache/test_disk_ownership.py): where each node is written, and what a statement writes."""

from __future__ import annotations

import ast
from typing import Iterator, Optional

# Methods that change a container in place: `x.f.append(...)` writes x.f.
MUTATORS = {"append", "extend", "insert", "pop", "popitem", "clear", "update", "setdefault", "remove",
            "add", "discard", "sort", "reverse"}


def with_classes(tree: ast.AST) -> Iterator[tuple[ast.AST, Optional[ast.ClassDef]]]:
    """Every node, with the class it is written in (None at module level)."""
    def walk(node: ast.AST, cls: Optional[ast.ClassDef]) -> Iterator[tuple[ast.AST, Optional[ast.ClassDef]]]:
        yield node, cls
        inner = node if isinstance(node, ast.ClassDef) else cls
        for child in ast.iter_child_nodes(node):
            yield from walk(child, inner)

    yield from walk(tree, None)


def assigned(node: ast.AST) -> list[ast.expr]:
    """What an assignment, augmented or annotated assignment, or `del` writes, tuples and lists
    unpacked (`a, x.f = ...` writes a and x.f); nothing for any other node."""
    if isinstance(node, (ast.Assign, ast.Delete)):
        todo = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        todo = [node.target]
    else:
        return []
    out: list[ast.expr] = []
    while todo:
        t = todo.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            todo.extend(t.elts)
        else:
            out.append(t)
    return out
