"""The import graph of one of our packages, read from its source with `ast` (tests/unit/test_architecture.py,
tests/unit/test_one_family_spec.py)."""

from __future__ import annotations

import ast
from pathlib import Path


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """Every dotted name an import statement may bind: the module, and module.name for `from m import name`
    (which is a submodule when one of that name exists)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join([*base, *([node.module] if node.module else [])])
    else:
        prefix = node.module or ""
    return [prefix, *(f"{prefix}.{alias.name}" for alias in node.names)]


def _statements(tree: ast.AST, deferred: bool):
    """Every node of `tree`; without `deferred`, none inside a function body (what importing the module runs)."""
    if deferred:
        yield from ast.walk(tree)
        return
    nodes = [tree]
    while nodes:
        node = nodes.pop()
        yield node
        nodes.extend(child for child in ast.iter_child_nodes(node) if not isinstance(child, FUNCTIONS))


FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def import_graph(root: Path, package: str, deferred: bool = True) -> dict[str, set[str]]:
    """module -> the modules of `package` it imports: anywhere in its body, or (`deferred` False) only where importing
    the module runs it, outside function bodies."""
    files = {module_name(path, root): path for path in (root / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        found = set()
        for node in _statements(ast.parse(path.read_text()), deferred):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in imported_names(node, module, path.name == "__init__.py"):
                    while name and name not in files:  # the longest prefix that is a module of ours
                        name = name.rpartition(".")[0]
                    if name and name != module:
                        found.add(name)
        graph[module] = found
    return graph
