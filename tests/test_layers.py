"""The package's layers: every import points down or stays in its layer, and no import circle.

The imports are read from the source (ast), every one of them (inside functions, under
TYPE_CHECKING): a name taken from a package's ``__init__`` counts as taken from the module the
``__init__`` takes it from. A circle is a set of modules that import each other in a loop (a
strongly connected component of the graph). docs/architecture.md draws the layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("queue_pg", "bench")

#: The layers, from the bottom up: a module may import its own layer and those below it. A
#: module of queue_pg/ itself (not in a sub-package) is the client core; the package's face
#: (queue_pg/__init__.py) hands on the core's and the jobs layer's public names, so it stands
#: with the jobs layer.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core", ("queue_pg.*",)),
    ("jobs", ("queue_pg", "queue_pg.jobs")),
    ("endpoints", ("queue_pg.sqs", "queue_pg.azure", "queue_pg.spark")),
    ("ops", ("queue_pg.ops",)),
    ("contrib", ("queue_pg.contrib",)),
    ("bench", ("bench",)),
]


#: Old import paths that the docs once showed, kept as modules that only hand on the names of
#: the module that moved (queue_pg/tasks.py -> queue_pg/jobs/tasks.py, ...). They stand outside
#: the layers, and nothing in the package or the benchmarks may import them.
OLD_PATHS = frozenset({"queue_pg.tasks", "queue_pg.periodic", "queue_pg.metrics",
                       "queue_pg.dashboard"})


def layer(module: str) -> int:
    """The index in LAYERS of the layer that holds ``module``."""
    best, found = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if prefix.endswith(".*"):  # a module right in the package
                if module.startswith(prefix[:-1]) and "." not in module[len(prefix) - 1:]:
                    length = len(prefix) - 1
                else:
                    continue
            elif module == prefix or module.startswith(prefix + "."):
                length = len(prefix) + (1 if module != prefix else 0)
            else:
                continue
            if length > best:
                best, found = length, i
    assert found is not None, f"{module} is in no layer: add it to LAYERS"
    return found


def upward(edges: dict[str, set[str]]) -> list[str]:
    """The imports from a lower layer up, as "a (layer) -> b (layer)"."""
    return sorted(f"{a} ({LAYERS[layer(a)][0]}) -> {b} ({LAYERS[layer(b)][0]})"
                  for a, targets in edges.items() if a not in OLD_PATHS
                  for b in targets if layer(b) > layer(a))


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


def test_the_reader_places_modules_and_sees_an_upward_import() -> None:
    names = [name for name, _ in LAYERS]
    assert [names[layer(m)] for m in ("queue_pg.errors", "queue_pg", "queue_pg.jobs.tasks",
                                      "queue_pg.sqs.app", "queue_pg.ops.cli.state",
                                      "queue_pg.contrib.django.apps", "bench.cycle")] == [
        "core", "jobs", "jobs", "endpoints", "ops", "contrib", "bench"]
    assert upward({"queue_pg.client": {"queue_pg.jobs.periodic", "queue_pg.errors"},
                   "queue_pg.ops.top": {"queue_pg.aio"}}) == [
        "queue_pg.client (core) -> queue_pg.jobs.periodic (jobs)"]


def test_no_import_circle() -> None:
    assert [sorted(c) for c in circles(graph())] == []


def test_no_import_from_a_lower_layer_up() -> None:
    assert upward(graph()) == []


def test_the_old_paths_only_hand_names_on_and_nothing_imports_them() -> None:
    edges = graph()
    assert edges.keys() >= OLD_PATHS
    assert sorted(f"{a} -> {b}" for a, targets in edges.items() for b in targets
                  if b in OLD_PATHS) == []
    for old in OLD_PATHS:  # no definition of its own: imports, __all__ and the docstring only
        path = ROOT / (old.replace(".", "/") + ".py")
        tree = ast.parse(path.read_text())
        kinds = {type(node).__name__ for node in tree.body}
        assert kinds <= {"Expr", "ImportFrom", "Assign"}, (old, kinds)
        assert all(t.id == "__all__" for node in tree.body if isinstance(node, ast.Assign)
                   for t in node.targets if isinstance(t, ast.Name)), old


def test_the_old_paths_give_the_moved_names() -> None:
    import queue_pg.dashboard
    import queue_pg.jobs.periodic
    import queue_pg.jobs.tasks
    import queue_pg.metrics
    import queue_pg.ops.dashboard
    import queue_pg.ops.metrics
    import queue_pg.periodic
    import queue_pg.schedules
    import queue_pg.tasks

    for old, *new in [(queue_pg.tasks, queue_pg.jobs.tasks),
                      (queue_pg.periodic, queue_pg.jobs.periodic, queue_pg.schedules),
                      (queue_pg.metrics, queue_pg.ops.metrics),
                      (queue_pg.dashboard, queue_pg.ops.dashboard)]:
        assert sorted(old.__all__) == sorted(n for m in new for n in m.__all__)
        assert all(getattr(old, n) is getattr(m, n) for m in new for n in m.__all__)
    assert queue_pg.tasks.registry is queue_pg.jobs.tasks.registry
