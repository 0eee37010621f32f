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

# The engine (DESIGN.md, "Two products, one repository"): what an application imports. It never
# imports the console (the faces and the domain an on-call engineer uses), so deleting those
# leaves a working queue; of the rest of the package it may use only this base.
ENGINE = ("console.queue",)
CONSOLE = ("console.web", "console.cli", "console.scheduler", "console.collectors", "console.alerts",
           "console.advisor", "console.maintenance", "console.browse", "console.demo", "console.prometheus",
           "console.signals", "console.samples", "console.external", "console.users")
ENGINE_BASE = ("console.db", "console.config", "console.sqlfiles", "console.resources", "console.jsonbounds",
               "console.redaction", "console.fingerprint", "console.histogram", "console.audit", "console.actions")
# Libraries of the console, and the handles' libraries: an adapter recognises a handle by the
# modules its application already imported (sys.modules), it never imports them itself.
CONSOLE_LIBRARIES = ("flask", "click", "werkzeug", "markdown_it", "prometheus_client", "gunicorn", "argon2")
OPTIONAL_LIBRARIES = ("asyncpg", "sqlalchemy", "django")


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


def test_the_engine_never_imports_the_console():
    mods = modules()
    known = set(mods)
    engine = [name for name in mods if _under(name, ENGINE)]
    assert {"console.queue.protocol", "console.queue.worker", "console.queue.tasks", "console.queue.limits",
            "console.queue.periodic"} <= set(engine)
    problems = []
    for name in engine:
        path = mods[name]
        for target, line in imports_of(name, path, known):
            top = target.split(".")[0]
            if _under(target, CONSOLE) or top in CONSOLE_LIBRARIES + OPTIONAL_LIBRARIES:
                problems.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
            elif top == "console" and not _under(target, ENGINE + ENGINE_BASE) and target != "console":
                problems.append(f"{path.relative_to(ROOT)}:{line} imports {target}, which is neither the engine "
                                "nor its base (ENGINE_BASE)")
    assert not problems, "the engine imports the console:\n" + "\n".join(problems)


def test_the_engines_base_imports_neither_the_console_nor_back_into_the_engine():
    # The base is shared: if it imported the console (or the engine), the engine would reach
    # the console through it.
    mods = modules()
    known = set(mods)
    problems = []
    for name in ENGINE_BASE:
        for target, line in imports_of(name, mods[name], known):
            if _under(target, CONSOLE + ENGINE) or target.split(".")[0] in CONSOLE_LIBRARIES + OPTIONAL_LIBRARIES:
                problems.append(f"{mods[name].relative_to(ROOT)}:{line} imports {target}")
    assert not problems, "the engine's base imports the console or the engine:\n" + "\n".join(problems)


def test_the_modules_that_moved_into_the_engine_keep_their_old_names():
    import console
    import console.limits
    import console.periodic
    import console.queue.limits
    import console.queue.periodic
    import console.queue.tasks
    import console.queue.worker
    import console.tasks
    import console.worker
    from console import queue as q

    assert console.worker is console.queue.worker and console.tasks is console.queue.tasks
    assert console.limits is console.queue.limits and console.periodic is console.queue.periodic
    assert (q.enqueue, q.enqueue_many, q.claim, q.Job) == (console.enqueue, console.enqueue_many,
                                                          console.queue.protocol.claim, console.Job)


def test_the_skiplock_import_name_is_the_engine_and_nothing_else():
    # `import skiplock` is what applications import: it must not pull the console in.
    path = ROOT / "skiplock" / "__init__.py"
    targets = [target for target, _ in imports_of("skiplock", path, set(modules()))]
    assert targets and all(_under(t, ENGINE) for t in targets), targets
