"""The import graph of the `console` package: no cycles, and the layering of DESIGN.md.

Every `import` and `from ... import` in console/**.py counts, including those inside functions
(a function-level import back into a face is still a circle: it only defers it), except those
under `if TYPE_CHECKING:`, which never run. `from package import name` is an edge to
`package.name` when that is a module, else to `package`.

Edges between a module and its own ancestor packages do not count, in either spelling: Python
runs `console/web/__init__.py` before any `console.web.x` anyway, so `from console.web import
state` inside console.web.auth adds no dependency that importing console.web.auth did not
already have (and every package's `__init__` re-exports its submodules, so counting those edges
would make every package a circle of its own).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "console"

FACES = ("console.web", "console.cli", "console.scheduler")
DOMAIN = ("console.queue", "console.maintenance", "console.alerts", "console.collectors", "console.advisor",
          "console.samples", "console.audit", "console.users")
FACE_LIBRARIES = ("flask", "click", "werkzeug")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST):
    """Every Import/ImportFrom node, at any depth, except under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imports_of(name: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(imported name, line): console modules resolved as described above, other top-level names as is."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
            continue
        if node.level:
            base = package.split(".")
            base = base[: len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        for alias in node.names:
            candidate = f"{target}.{alias.name}"
            found.append((candidate if candidate in known else target, node.lineno))
    return found


def graph() -> dict[str, dict[str, int]]:
    mods = modules()
    known = set(mods)
    edges: dict[str, dict[str, int]] = {}
    for name, path in mods.items():
        edges[name] = {}
        for target, line in imports_of(name, path, known):
            if target in known and target != name and not name.startswith(target + "."):
                edges[name].setdefault(target, line)
    return edges


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (as a path that returns to its start) per strongly connected component."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan; the graph has ~100 nodes, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
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
                components.append(component)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    found = []
    for component in components:
        members = set(component)
        start = min(component)
        path, seen = [start], {start}
        while True:  # walk inside the component until a node repeats
            nxt = next(w for w in sorted(edges[path[-1]]) if w in members)
            if nxt in seen:
                found.append(path[path.index(nxt):] + [nxt])
                break
            path.append(nxt)
            seen.add(nxt)
    return found


def describe(cycle: list[str], edges: dict[str, dict[str, int]]) -> str:
    return " -> ".join(f"{a} (line {edges[a][b]})" for a, b in zip(cycle, cycle[1:], strict=False)) + f" -> {cycle[-1]}"


def test_the_graph_sees_function_level_imports():
    # the detector must see an import inside a function body, or it would miss the circles the
    # issue names (a domain function importing a face back)
    edges = graph()
    assert "console.alerts.addresses" in edges["console.alerts.rules"]  # imported inside check_address
    assert cycles({"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}) == [["a", "b", "c", "a"]]


def test_no_import_cycles_among_console_modules():
    edges = graph()
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n".join(describe(c, edges) for c in found)


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_domain_never_imports_a_face_nor_flask_or_click():
    mods = modules()
    known = set(mods)
    problems = []
    for name, path in mods.items():
        if not _under(name, DOMAIN):
            continue
        for target, line in imports_of(name, path, known):
            if _under(target, FACES) or target.split(".")[0] in FACE_LIBRARIES:
                problems.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not problems, "the domain imports a face:\n" + "\n".join(problems)
