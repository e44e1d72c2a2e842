"""Imports only point down: gateway -> tiering -> packer."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {
    "packer": {"tiering", "gateway", "asyncio", "rocksdict", "aiobotocore", "botocore", "boto3", "socket"},
    "tiering": {"gateway", "fastapi", "starlette", "uvicorn"},
}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_upward_imports(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no modules found under {package}/"
    bad = {
        str(f.relative_to(ROOT)): sorted(imported_roots(f) & FORBIDDEN[package])
        for f in files
        if imported_roots(f) & FORBIDDEN[package]
    }
    assert not bad, f"upward or forbidden imports: {bad}"


# --- structure: import cycles and class sizes ------------------------------------------

PRODUCT_PACKAGES = ("gateway", "tiering", "packer")
MAX_CLASS_LINES = 450


def module_name(path: Path) -> str:
    """Dotted name Python gives the file; a package's `__init__.py` is the package itself."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def product_modules() -> dict[str, Path]:
    """Every module of the product packages, by dotted name."""
    return {
        module_name(path): path
        for package in PRODUCT_PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def is_type_checking(test: ast.expr) -> bool:
    """`TYPE_CHECKING` or `typing.TYPE_CHECKING`: the guard whose body never runs."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """All nodes of the tree except the bodies of `if TYPE_CHECKING:`.

    Imports inside functions are kept: they run too, only later, so they still tie the
    modules together. Annotation-only imports never run and cannot form a cycle.
    """
    pending = [tree]
    while pending:
        node = pending.pop()
        yield node
        if isinstance(node, ast.If) and is_type_checking(node.test):
            pending.extend(node.orelse)
        else:
            pending.extend(ast.iter_child_nodes(node))


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of `name` that is a product module, or None for outside code.

    `from pkg import thing` names a module when `pkg.thing` is one, otherwise an attribute
    of `pkg`; trimming the name from the right covers both.
    """
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_base(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a `from ... import` reads from, relative levels included."""
    if not node.level:
        return node.module or ""
    anchor = module.split(".") if is_package else module.split(".")[:-1]
    anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


def imported_modules(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The product modules `module` imports at run time, itself excluded.

    Only the module named counts: `import a.b` is an edge to `a.b`, not also to the
    package `a` whose `__init__` runs first, as a package is a namespace, not a layer.
    """
    is_package = path.name == "__init__.py"
    found = set()
    for node in runtime_nodes(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = import_base(node, module, is_package)
            names = [f"{base}.{alias.name}" for alias in node.names]
            names = [name if resolve(name, modules) else base for name in names]
        else:
            continue
        found.update(filter(None, (resolve(name, modules) for name in names)))
    found.discard(module)
    if is_package:
        # A package gathering its own submodules is how packages are built, not a cycle.
        found = {target for target in found if not target.startswith(module + ".")}
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the product modules it imports."""
    modules = product_modules()
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components with more than one module, each sorted: the import cycles.

    Iterative, so a deep import chain cannot hit Python's recursion limit.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            child = next((s for s in successors if s not in index or s in on_stack), None)
            if child is None:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
            elif child in index:
                low[node] = min(low[node], index[child])
            else:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
    return sorted(cycles)


def test_no_import_cycles() -> None:
    """Modules that import each other cannot be read, tested or moved one at a time."""
    cycles = strongly_connected(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join("  " + " ".join(c) for c in cycles)


def long_classes(path: Path) -> list[str]:
    """`file:line name (size lines)` for each class in `path` over MAX_CLASS_LINES."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ClassDef):
            size = node.end_lineno - node.lineno + 1
            if size > MAX_CLASS_LINES:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({size} lines)")
    return found


def test_no_oversized_classes() -> None:
    """A class this long holds several jobs; splitting it keeps each one reviewable."""
    found = sorted(line for path in product_modules().values() for line in long_classes(path))
    heading = f"classes over {MAX_CLASS_LINES} lines:\n"
    assert not found, heading + "\n".join("  " + line for line in found)
