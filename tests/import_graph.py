"""The import graph of a Python source tree, read with ``ast`` (every import:
top level, inside functions, and under ``TYPE_CHECKING``), and its cycles."""

from __future__ import annotations

import ast
from pathlib import Path


def module_files(src: Path) -> dict[str, Path]:
    """Dotted module name → file, for every ``.py`` under `src` (a folder of packages)."""
    out = {}
    for path in src.rglob("*.py"):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _absolute(module: str, is_package: bool, level: int, name: str) -> str:
    if level == 0:
        return name
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def import_graph(src: Path, extra_modules: tuple[str, ...] = ()) -> dict[str, set[str]]:
    """Module → the modules of the same tree it imports. ``from pkg import x``
    counts as importing ``pkg.x`` when that is a module, else ``pkg``."""
    files = module_files(src)
    known = set(files) | set(extra_modules)

    def owner(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in known}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(module, is_package, node.level, node.module or "")
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
                ]
            else:
                continue
            for target in targets:
                found = owner(target)
                if found is not None and found != module:
                    graph[module].add(found)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)
