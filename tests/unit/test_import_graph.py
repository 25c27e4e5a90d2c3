"""The library's import graph: no import circle between its modules (lazy, function-level imports included: a circle
closed inside a function is still a circle), and the layer contracts of pyproject.toml hold (`lint-imports`)."""
from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]


def strongly_connected_components(edges: Mapping[str, Iterable[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative (the graph is deep enough to hit Python's recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(edges.get(root, ())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(edges.get(succ, ()))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    components.append(component)
    return components


def test_strongly_connected_components_finds_circles():
    edges = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": [], "e": ["e"]}
    assert sorted(map(sorted, strongly_connected_components(edges))) == [["a", "b", "c"], ["d"], ["e"]]


def test_pr_rlhf_has_no_import_circle():
    graph = grimp.build_graph("pr_rlhf", cache_dir=None)
    edges = {module: sorted(graph.find_modules_directly_imported_by(module)) for module in sorted(graph.modules)}
    circles = [sorted(c) for c in strongly_connected_components(edges) if len(c) > 1]
    described = []
    for circle in circles:   # each with one concrete loop, to start untangling it from
        start = circle[0]
        succ = next(m for m in edges[start] if m in circle)
        loop = (start, *graph.find_shortest_chain(importer=succ, imported=start))
        described.append(f"{len(circle)} modules: {', '.join(circle)}\n  e.g. {' -> '.join(loop)}")
    assert not circles, "import circles in pr_rlhf:\n" + "\n".join(described)


def test_layer_contracts_hold():
    lint_imports = Path(sys.executable).with_name("lint-imports")
    run = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
