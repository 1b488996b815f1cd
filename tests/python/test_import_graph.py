"""The imports between bluefog's own modules form no circle (no TensorFlow, no MPI needed).

The sources are parsed with ``ast``, not imported. Every ``import`` counts, at module level and
inside functions alike: a function-local import that dodges a circle at import time is still a
circle in the design. An import under ``if TYPE_CHECKING:`` does not count (it never runs).

An import of ``bluefog.a.b`` runs the package ``bluefog.a`` first; that edge to a parent package
is not counted (every submodule has it), but an explicit ``from bluefog.a import name`` of a name
defined in ``bluefog/a/__init__.py`` is an edge to that package.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Dict, List, Set, Tuple

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = "bluefog"

# module -> {imported module: (file, line) of the first such import}
Graph = Dict[str, Dict[str, Tuple[str, int]]]


def _modules(root: pathlib.Path, package: str) -> Dict[str, pathlib.Path]:
    """Module name -> source file, for every ``.py`` file under ``root/package``."""
    mods = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import / ImportFrom node, at any depth, except under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)
            else:
                stack.append(child)


def _owner(name: str, mods: Dict[str, pathlib.Path]) -> str:
    """The longest prefix of dotted ``name`` that is one of ``mods`` ("" if none)."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name


def build_graph(root: pathlib.Path = ROOT, package: str = PACKAGE) -> Graph:
    mods = _modules(root, package)
    graph: Graph = {name: {} for name in mods}
    for name, path in mods.items():
        is_package = path.name == "__init__.py"
        here = name if is_package else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _imports(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [_owner(alias.name, mods) for alias in node.names]
            else:
                if node.level:
                    base = here.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    targets.append(sub if sub in mods else _owner(source, mods))
            for target in targets:
                if target and target != name:
                    rel = str(path.relative_to(root))
                    graph[name].setdefault(target, (rel, node.lineno))
    return graph


def find_cycles(graph: Graph) -> List[List[str]]:
    """One cycle (``[a, b, ..., a]``) per strongly connected component with more than one
    module (Tarjan's algorithm)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    on_stack: Set[str] = set()
    stack: List[str] = []
    components: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, {})):
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
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)

    cycles = []
    for component in components:
        members = set(component)
        start = component[0]
        # Shortest path back to start inside the component (breadth first).
        parent = {start: None}
        queue = [start]
        end = None
        while queue and end is None:
            v = queue.pop(0)
            for w in sorted(graph[v]):
                if w not in members:
                    continue
                if w == start:
                    end = v
                    break
                if w not in parent:
                    parent[w] = v
                    queue.append(w)
        path = []
        while end is not None:  # end, its parent, ..., start
            path.append(end)
            end = parent[end]
        cycles.append(path[::-1] + [start])
    return cycles


def describe(graph: Graph, cycle: List[str]) -> str:
    steps = []
    for a, b in zip(cycle, cycle[1:]):
        file, line = graph[a][b]
        steps.append(f"  {a} -> {b}  ({file}:{line})")
    return "\n".join(steps)


def test_no_import_cycle():
    graph = build_graph()
    cycles = find_cycles(graph)
    report = "\n\n".join(describe(graph, c) for c in cycles)
    if cycles:
        print(report)
    assert not cycles, f"import circle(s) between bluefog's modules:\n{report}"


def test_graph_sees_known_imports():
    # Guards the parser: a module-level and a function-level edge that exist today.
    graph = build_graph()
    assert "bluefog.tensorflow.adasum" in graph["bluefog.tensorflow.mpi_ops"]
    assert "bluefog.common.basics" in graph["bluefog.common.process_sets"]
    assert "bluefog.tensorflow" in graph["bluefog.tensorflow.calibrate"]  # inside functions


def test_cycle_through_function_level_import_is_found(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import x\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n")
    graph = build_graph(tmp_path, "pkg")
    assert "pkg.a" not in graph["pkg.c"]
    cycles = find_cycles(graph)
    assert len(cycles) == 1
    assert cycles[0][0] == cycles[0][-1] and set(cycles[0]) == {"pkg.a", "pkg.sub.b"}
    assert "pkg/sub/b.py:2" in describe(graph, cycles[0])
