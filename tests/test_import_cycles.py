"""No two modules of the service import each other, directly or through others (CONVENTIONS.md:
data flows one way). Every import counts: at the top, under ``if TYPE_CHECKING:``, or inside a
function."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "service" / "context_assembly"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The service's modules that a module names in its imports. ``from package import name``
    names the submodule when there is one of that name, else the package; importing a submodule
    is not counted as importing its parent package (Python runs the parent's ``__init__`` first,
    but a package that re-exports its own modules would otherwise be a cycle with each of them).
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in known else base)
    return {module for module in found if module in known and module != name}


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imported(name, path, known) for name, path in known.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle of each strongly connected component of more than one module (Tarjan): the
    shortest through the component's first module, which names at least two of its modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_one_cycle(graph, component) for component in components]


def _one_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for other in sorted(graph[node] & component):
                if other == start:
                    return [*paths[node], start]
                if other not in paths:
                    paths[other] = [*paths[node], other]
                    following.append(other)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # pragma: no cover - a component has one


def test_the_import_graph_is_read() -> None:
    """The graph holds every kind of import a module makes: a submodule named by ``from package
    import name``, one under ``if TYPE_CHECKING:``, and one inside a function."""
    graph = _graph()
    assert "context_assembly.api.app" in graph["context_assembly.api"]
    assert "context_assembly.preparations.usage" in graph["context_assembly.tracing"]
    assert "context_assembly.api.app" in graph["context_assembly.replay.driver"]


def test_cycle_finder_names_a_cycle() -> None:
    """The finder reports a cycle through a type-only import as well as any other."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]


def test_no_module_imports_itself_through_others() -> None:
    """No cycle in the imports of service/context_assembly, type-only and deferred ones included."""
    cycles = _cycles(_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)
