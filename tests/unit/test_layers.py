"""Imports only point down: gateway -> tiering -> packer."""

from __future__ import annotations

import ast
import sys
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


# --- structure: import cycles, rooms, file and class sizes ------------------------------

PRODUCT_PACKAGES = ("gateway", "tiering", "packer")
SCRIPT_DIRS = ("benchmarks",)  # scripts that import their siblings as top-level modules
MAX_CLASS_LINES = 450
MAX_FILE_LINES = 600


def module_name(path: Path) -> str:
    """Dotted name Python gives the file; a package's `__init__.py` is the package itself."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def product_modules() -> dict[str, Path]:
    """Every module of the product packages and the script folders, by dotted name."""
    return {
        module_name(path): path
        for package in PRODUCT_PACKAGES + SCRIPT_DIRS
        for path in sorted((ROOT / package).rglob("*.py"))
    }


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
    """The product modules `module` imports, itself excluded.

    Every import counts: at the top, inside functions (they run later, still tying the
    modules together) and under `if TYPE_CHECKING:` (a name needed only for annotations
    still means the two modules cannot be read or moved apart). A script folder's
    modules import their siblings by bare name (`import _common`). Only the module
    named counts: `import a.b` is an edge to `a.b`, not also to the package `a`.
    """
    is_package = path.name == "__init__.py"
    folder = module.rpartition(".")[0] if module.split(".")[0] in SCRIPT_DIRS else ""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = import_base(node, module, is_package)
            names = [f"{base}.{alias.name}" for alias in node.names]
            names = [name if resolve(name, modules) else base for name in names]
        else:
            continue
        if folder:
            names = [f"{folder}.{name}" if f"{folder}.{name.split('.')[0]}" in modules else name
                     for name in names]
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


def test_a_cycle_is_found() -> None:
    """The finder itself: a type-only import closing a loop is a cycle."""
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# --- the rooms of tiering/ --------------------------------------------------------------

# Modules at tiering/'s top level that every room may import, and that import no room.
FOUNDATION = {"errors", "meta", "settings", "pool", "jobs", "files", "memo", "admission"}
# The service on top, which builds and calls the rooms: it may import any of them.
SERVICE = {"objects", "node"}
# Room -> the rooms it may import (the foundation always). Bottom first: a room names
# only rooms above it in this table, so the directions form no loop.
ROOMS: dict[str, set[str]] = {
    "model": set(),
    "capacity": set(),
    "identity": {"capacity"},
    "index": {"model"},
    "hot": {"model"},
    "reads": {"model", "capacity", "hot"},
    "cluster": {"model", "capacity", "index", "hot", "reads"},
    "maintenance": {"model", "capacity", "index", "hot", "reads", "cluster"},
    "mounts": {"model", "capacity", "index", "hot", "reads", "cluster"},
    "prefetch": {"model", "capacity", "index", "hot", "reads", "cluster", "mounts"},
    "batch": {"model", "index", "hot", "reads", "prefetch"},
    "managed": {"model", "capacity", "index", "hot", "reads", "cluster", "maintenance"},
}
MAX_TOP_MODULES = 12


def room_of(module: str) -> str:
    """`tiering.hot.tier` -> `hot`; a top-level module is its own name."""
    return module.split(".")[1] if module.count(".") >= 1 else ""


@pytest.mark.parametrize("table", ["ROOMS", "GATEWAY_FLOORS"])
def test_rooms_are_ordered(table: str) -> None:
    """Each room names only rooms listed before it: the table itself has no loop."""
    seen: set[str] = set()
    for room, allowed in globals()[table].items():
        assert allowed <= seen, f"{room} may import {sorted(allowed - seen)}, listed after it"
        seen.add(room)


def test_tiering_imports_follow_the_rooms() -> None:
    """A tiering module imports the foundation, its own room and the rooms its room may."""
    wrong = []
    for module, targets in import_graph().items():
        if not module.startswith("tiering.") or module.count(".") < 1:
            continue
        source = room_of(module)
        for target in sorted(t for t in targets if t.startswith("tiering.")):
            room = room_of(target)
            if room in FOUNDATION or room == source or source in SERVICE:
                continue
            if source in FOUNDATION or room in SERVICE or room not in ROOMS.get(source, set()):
                wrong.append(f"{module} -> {target}")
    assert not wrong, "imports against the rooms (tests/unit/test_layers.py ROOMS):\n  " + "\n  ".join(wrong)


def test_tiering_top_level_is_small_and_every_room_is_described() -> None:
    top = sorted(p.stem for p in (ROOT / "tiering").glob("*.py") if p.stem != "__init__")
    assert set(top) == FOUNDATION | SERVICE, f"tiering/ top level: {top}"
    assert len(top) <= MAX_TOP_MODULES
    rooms = sorted(p.parent.name for p in (ROOT / "tiering").glob("*/__init__.py"))
    assert rooms == sorted(ROOMS), f"rooms on disk {rooms} against the table {sorted(ROOMS)}"
    for room in rooms:
        doc = ast.get_docstring(ast.parse((ROOT / "tiering" / room / "__init__.py").read_text()))
        assert doc and "May import" in doc, f"tiering/{room}/__init__.py says what it owns and may import"


def test_a_wrong_direction_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """The room check itself: an index module importing the hot tier is refused."""
    real = import_graph()
    monkeypatch.setattr(sys.modules[__name__], "import_graph",
                        lambda: {**real, "tiering.index.db": real["tiering.index.db"] | {"tiering.hot.tier"}})
    with pytest.raises(AssertionError, match="tiering.index.db -> tiering.hot.tier"):
        test_tiering_imports_follow_the_rooms()


# --- the rooms of gateway/ --------------------------------------------------------------

# Floors of gateway/, bottom first: a room (a package) or a top-level module, and the floors
# it may import. Each names only floors listed before it, so the directions form no loop.
# The client room is the floor a training job imports: nothing of the server below it.
GATEWAY_FLOORS: dict[str, set[str]] = {
    "version": set(),
    "client": set(),
    "config": {"client"},
    "s3": set(),
    "auth": {"s3"},
    "observability": {"config", "s3"},
    "serving": {"config", "s3"},
    "handlers": {"auth", "config", "s3", "serving"},
    "routes": {"handlers", "s3"},
    "app": {"auth", "config", "handlers", "observability", "routes", "s3"},
    "storage": {"client", "config"},
    "node": {"auth", "config", "handlers", "observability", "serving", "storage"},
    "admin": {"client", "config", "observability", "s3", "storage", "version"},
    "workers": {"app", "auth", "config", "handlers", "observability", "routes", "s3", "serving"},
    "server": {"admin", "app", "client", "config", "node", "serving", "version", "workers"},
    "cli": {"client", "config", "server", "storage", "version"},
    "__main__": {"cli"},
}
GATEWAY_ROOMS = {"client", "config", "s3", "auth", "observability", "serving", "handlers", "admin",
                 "workers", "cli"}
# What the client room may not import, beyond gateway/'s other rooms: the server's packages
# and the libraries only the server installs (pyproject.toml's ``server`` extra).
CLIENT_FORBIDDEN = {"tiering", "packer", "fastapi", "starlette", "uvicorn", "rocksdict", "aiobotocore",
                    "zstandard", "msgpack", "awscrt", "typer", "rich", "prometheus_client", "cryptography",
                    "httptools"}


def test_gateway_imports_follow_the_floors() -> None:
    """A gateway module imports its own room and the floors its floor may."""
    wrong = []
    for module, targets in import_graph().items():
        if not module.startswith("gateway.") or module.count(".") < 1:
            continue
        source = room_of(module)
        for target in sorted(t for t in targets if t.startswith("gateway.")):
            floor = room_of(target)
            if floor != source and floor not in GATEWAY_FLOORS.get(source, set()):
                wrong.append(f"{module} -> {target}")
    assert not wrong, "imports against gateway's floors (tests/unit/test_layers.py GATEWAY_FLOORS):\n  " + \
        "\n  ".join(wrong)


def test_the_client_room_imports_nothing_of_the_server() -> None:
    files = sorted((ROOT / "gateway" / "client").rglob("*.py"))
    assert files
    bad = {str(f.relative_to(ROOT)): sorted(imported_roots(f) & CLIENT_FORBIDDEN) for f in files
           if imported_roots(f) & CLIENT_FORBIDDEN}
    assert not bad, f"the client room imports the server: {bad}"


def test_gateway_top_level_is_small_and_every_room_is_described() -> None:
    top = sorted(p.stem for p in (ROOT / "gateway").glob("*.py") if p.stem != "__init__")
    assert set(top) == set(GATEWAY_FLOORS) - GATEWAY_ROOMS, f"gateway/ top level: {top}"
    assert len(top) <= MAX_TOP_MODULES
    rooms = sorted(p.parent.name for p in (ROOT / "gateway").glob("*/__init__.py"))
    assert rooms == sorted(GATEWAY_ROOMS), f"rooms on disk {rooms} against the table"
    for room in rooms:
        doc = ast.get_docstring(ast.parse((ROOT / "gateway" / room / "__init__.py").read_text()))
        assert doc and "May import" in doc, f"gateway/{room}/__init__.py says what it owns and may import"


def test_every_package_has_a_docstring() -> None:
    missing = [str(p.relative_to(ROOT)) for package in PRODUCT_PACKAGES
               for p in sorted((ROOT / package).rglob("__init__.py"))
               if not ast.get_docstring(ast.parse(p.read_text(encoding="utf-8")))]
    assert not missing, f"packages without a docstring: {missing}"


def test_a_wrong_gateway_direction_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """The floor check itself: the S3 protocol room importing a handler is refused."""
    real = import_graph()
    monkeypatch.setattr(sys.modules[__name__], "import_graph",
                        lambda: {**real, "gateway.s3.xml": real["gateway.s3.xml"] | {"gateway.handlers.objects"}})
    with pytest.raises(AssertionError, match="gateway.s3.xml -> gateway.handlers.objects"):
        test_gateway_imports_follow_the_floors()


def test_a_client_import_of_the_server_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client check itself: a client module importing tiering is refused."""
    real = imported_roots
    hints = ROOT / "gateway" / "client" / "hints.py"
    monkeypatch.setattr(sys.modules[__name__], "imported_roots",
                        lambda path: real(path) | {"tiering"} if path == hints else real(path))
    with pytest.raises(AssertionError, match="hints.py"):
        test_the_client_room_imports_nothing_of_the_server()


# --- sizes -------------------------------------------------------------------------------


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


def test_no_oversized_files() -> None:
    """Past ~600 lines a module holds several concepts: split it along its seams."""
    found = sorted(
        f"{path.relative_to(ROOT)} ({lines} lines)"
        for path in product_modules().values()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES
    )
    assert not found, f"files over {MAX_FILE_LINES} lines:\n  " + "\n  ".join(found)
