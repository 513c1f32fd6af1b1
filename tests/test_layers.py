"""Import circles of the package and the benchmarks: none but the known ones, which only shrink.

The imports are read from the source (ast), every one of them (inside functions, under
TYPE_CHECKING): a name taken from a package's ``__init__`` counts as taken from the module the
``__init__`` takes it from. A circle is a set of modules that import each other in a loop (a
strongly connected component of the graph).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("queue_pg", "bench")

# The circles the code has today; a new one fails, and so does one that is gone (then take it
# out of this list). Each is broken by moving a shape down a layer: see docs/architecture.md.
KNOWN: list[frozenset[str]] = [
    # the client imports periodic's schedule statements; periodic -> tasks -> client
    frozenset({"queue_pg.aio", "queue_pg.client", "queue_pg.jobs.declare", "queue_pg.jobs.job",
               "queue_pg.jobs.periodic", "queue_pg.jobs.tasks"}),
    # Dashboard.wsgi/.asgi build the adapters, which take the Request/Response shapes from core
    frozenset({"queue_pg.ops.dashboard.adapters", "queue_pg.ops.dashboard.core"}),
]


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _raw_imports(module: str, path: Path) -> list[tuple[str, str | None]]:
    """(module, name) pairs: ``import a.b`` is ("a.b", None), ``from a import b`` ("a", "b")."""
    pairs: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            pairs.extend((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, path.name == "__init__.py", node)
            pairs.extend((source, alias.name) for alias in node.names)
    return pairs


def graph() -> dict[str, set[str]]:
    """module -> the modules of ours it imports."""
    mods = modules()
    raw = {m: _raw_imports(m, p) for m, p in mods.items()}
    # what each package's __init__ hands on: name -> the module it comes from
    faces = {m: {name: source for source, name in raw[m] if name and source in mods}
             for m, p in mods.items() if p.name == "__init__.py"}

    def target(source: str, name: str | None) -> str | None:
        if name and f"{source}.{name}" in mods:
            return f"{source}.{name}"
        while name and source in faces and name in faces[source]:
            source = faces[source][name]
            if f"{source}.{name}" in mods:
                return f"{source}.{name}"
        return source if source in mods else None

    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, pairs in raw.items():
        for source, name in pairs:
            t = target(source, name)
            if t and t != m:
                edges[m].add(t)
    return edges


def circles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.add(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
    return found


def test_the_reader_sees_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_but_the_known_ones() -> None:
    found = circles(graph())
    new = [sorted(c) for c in found if not any(c <= known for known in KNOWN)]
    assert new == [], f"new import circles: {new}"
    gone = [sorted(k) for k in KNOWN if not any(c == k for c in found)]
    assert gone == [], f"known circles that changed or are gone (update KNOWN): {gone}"
