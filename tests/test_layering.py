"""The layering DESIGN.md draws, checked on the source: protocol handlers use the core's
public API alone (no private module, name or attribute of it), and no two handler modules
import each other at load time."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HANDLERS = sorted((ROOT / "handlers").rglob("*.py"))
#: Names that hold core objects in handler code; a ``_`` attribute of one is core-private.
CORE_OBJECTS = {"broker", "topic", "subscription", "sub", "ml", "cursor", "storage", "policies",
                "metadata", "auth", "stats", "bridge"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _private_core_uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "core":
            if any(p.startswith("_") for p in node.module.split(".")):
                found.append(f"{path.name}:{node.lineno} from {node.module}")
            found += [f"{path.name}:{node.lineno} {node.module}.{a.name}" for a in node.names
                      if a.name.startswith("_")]
        elif isinstance(node, ast.Import):
            found += [f"{path.name}:{node.lineno} import {a.name}" for a in node.names
                      if a.name.split(".")[0] == "core" and any(p.startswith("_") for p in a.name.split("."))]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value
            name = owner.attr if isinstance(owner, ast.Attribute) else owner.id if isinstance(owner, ast.Name) else ""
            if name in CORE_OBJECTS:
                found.append(f"{path.name}:{node.lineno} {name}.{node.attr}")
    return found


@pytest.mark.parametrize("path", HANDLERS, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_handler_uses_only_the_public_core_api(path: Path) -> None:
    assert _private_core_uses(path) == []


def test_the_check_sees_private_uses() -> None:
    probe = ROOT / "handlers" / "__init__.py"
    source = "from core._native import crc32c\nfrom core.format import _plan\nx = self.broker._auto_create\n"
    tree = ast.parse(source)
    assert tree  # the probe parses; run the check on it through a temporary file
    tmp = probe.with_name("_layering_probe.py")
    try:
        tmp.write_text(source)
        assert len(_private_core_uses(tmp)) == 3
    finally:
        tmp.unlink()


def _load_time_imports(path: Path, known: set[str]) -> set[str]:
    """The handler modules ``path`` imports when it is loaded (not under TYPE_CHECKING,
    not inside a function)."""
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    out.add(full if full in known else node.module)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(node.orelse)
    visit(tree.body)
    return {m for m in out if m in known}


def test_handler_modules_import_no_cycle() -> None:
    modules = {_module_name(p): p for p in HANDLERS}
    known = set(modules)
    graph = {m: _load_time_imports(p, known) - {m} for m, p in modules.items()}
    # a package's __init__ importing its own modules is how a package exposes them
    for m in graph:
        graph[m] = {d for d in graph[m] if not (m in known and modules[m].name == "__init__.py"
                                                 and d.startswith(m + "."))}
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                walk(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            walk(m)
    assert cycles == []
