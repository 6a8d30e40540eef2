"""The import graph of eada has one direction: no cycle between its top-level parts.

A top-level part is a module or package directly under ``src/eada`` (``config``, ``data``,
``train``, ``reports``, ...). Every ``import`` counts, also one inside a function or under
``TYPE_CHECKING``: a late import hides a cycle from the interpreter, not from the reader.
CONTRIBUTING.md's module map shows the layers.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "eada"


def _module_name(path: Path) -> str:
    """``src/eada/train/loop.py`` -> ``eada.train.loop`` (a package is its ``__init__``)."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[str, ...]]:
    """What ``module`` imports, anywhere in the file: for each import, the absolute names it may
    mean, most specific first (``from eada import config`` is the module ``eada.config``;
    ``from eada.config import load_config`` falls back to ``eada.config``)."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield (alias.name,)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                yield (f"{target}.{alias.name}", target)


def module_graph() -> dict[str, set[str]]:
    """Edges module -> the eada modules it imports, over every ``.py`` file of the package."""
    files = sorted((SRC / PACKAGE).rglob("*.py"))
    modules = {_module_name(f): f for f in files}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets = set()
        for candidates in _imported(tree, name, path.name == "__init__.py"):
            # the first name that is an eada module, else the longest module it starts with
            known = [c for c in candidates if c in modules]
            target = known[0] if known else candidates[-1]
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                targets.add(target)
        graph[name] = targets
    return graph


def _part(module: str) -> str | None:
    """``eada.train.loop`` -> ``train``; ``eada`` itself is the root, no part."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else None


def part_graph(modules: dict[str, set[str]]) -> dict[str, set[str]]:
    """Edges between top-level parts (``eada.train.loop`` belongs to part ``train``)."""
    graph: dict[str, set[str]] = {}
    for module, targets in modules.items():
        source = _part(module)
        if source is None:
            continue
        edges = graph.setdefault(source, set())
        for target in targets:
            other = _part(target)
            if other is not None and other != source:
                edges.add(other)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles (``[a, b, ..., a]``) in ``graph``: in every strongly connected group of more than
    one node, a shortest cycle through each member (each cycle listed once)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm; the graph is small
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    cycles: list[list[str]] = []
    seen: set[frozenset[tuple[str, str]]] = set()
    for group in sorted(groups):
        for start in group:
            cycle = _cycle_through(graph, start, set(group))
            key = frozenset(itertools.pairwise(cycle))
            if key not in seen:
                seen.add(key)
                cycles.append(cycle)
    return cycles


def _cycle_through(graph: dict[str, set[str]], start: str, members: set[str]) -> list[str]:
    """A shortest cycle through ``start`` inside ``members`` (breadth first)."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt_frontier = []
        for node in frontier:
            for nxt in sorted(graph.get(node, set()) & members):
                if nxt == start:
                    return [*paths[node], start]
                if nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    nxt_frontier.append(nxt)
        frontier = nxt_frontier
    raise AssertionError(f"no cycle through {start} in {sorted(members)}")  # pragma: no cover


def _describe(cycles: list[list[str]], modules: dict[str, set[str]]) -> str:
    """Each cycle on one line, then the module imports behind each of its steps."""
    lines = []
    for cycle in cycles:
        lines.append(" -> ".join(cycle))
        for source, target in itertools.pairwise(cycle):
            why = sorted(
                f"{m} imports {t}"
                for m, ts in modules.items()
                for t in ts
                if _part(m) == source and _part(t) == target
            )
            lines.append(f"  {source} -> {target}: " + "; ".join(why))
    return "\n".join(lines)


def test_finder_names_a_cycle() -> None:
    """The checker itself: a planted cycle is found and named, a chain is not a cycle."""
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": {"a", "c"}, "c": {"b"}}) == [
        ["a", "b", "a"],
        ["c", "b", "c"],
    ]
    tree = ast.parse("def f():\n    from ..config import X\n    import eada.data.tasks\n")
    assert list(_imported(tree, "eada.train.loop", is_package=False)) == [
        ("eada.config.X", "eada.config"),
        ("eada.data.tasks",),
    ]


def test_no_import_cycle_between_top_level_parts() -> None:
    """No cycle between the modules and packages directly under ``src/eada``."""
    modules = module_graph()
    graph = part_graph(modules)
    assert {"config", "data", "models", "train", "reports"} <= set(graph)
    cycles = find_cycles(graph)
    message = "import cycles between eada's top-level parts:\n"
    assert not cycles, message + _describe(cycles, modules)


def test_no_import_cycle_between_modules() -> None:
    """Inside a part too, no two modules import each other (directly or around a loop)."""
    modules = module_graph()
    cycles = find_cycles(modules)
    message = "import cycles between eada's modules:\n"
    assert not cycles, message + "\n".join(" -> ".join(c) for c in cycles)


def _layers_in_contributing() -> dict[str, int]:
    """CONTRIBUTING.md's layer table: part -> layer number."""
    text = (SRC.parent / "CONTRIBUTING.md").read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    layers: dict[str, int] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].isdigit():
            for part in cells[1].split(","):
                layers[part.strip().strip("`")] = int(cells[0])
    return layers


def test_imports_point_down_the_layers_of_contributing() -> None:
    """Every part is in CONTRIBUTING.md's layer table and imports only parts in lower layers."""
    modules = module_graph()
    graph = part_graph(modules)
    layers = _layers_in_contributing()
    assert not set(graph) - set(layers), f"parts missing from the table: {set(graph) - set(layers)}"
    upward = sorted(
        f"{m} imports {t} (layer {layers[_part(m) or '']} -> {layers[_part(t) or '']})"
        for m, ts in modules.items()
        for t in ts
        if _part(m) and _part(t) and _part(m) != _part(t)
        if layers[_part(m) or ""] <= layers[_part(t) or ""]
    )
    assert not upward, "imports that do not point down CONTRIBUTING.md's layers:\n" + "\n".join(
        upward
    )
