"""The house: minipar's import graph has no cycles, and its arrows point one way.

Layers, from the bottom (docs/developing.md, "The house"):

    techniques        comm/ collectives nn/ tensor_parallel/ pipeline/ ... plan/ autoparallel/ (everything else)
    course            the registry (it names modules as strings; it imports none of them)
    lessons/, labs/   check drivers and their harness; lab graders (labs may use the lessons' harness)
    bench/, figures/  benchmarks write records; figures draw them (a figure may run a benchmark)
    cli/              ``minipar ...``

An import may go down or stay on its floor, never up. Every import counts: module level, inside
a function, ``from . import x``, and a ``"minipar.pkg.mod:function"`` string handed to ``launch``
(outside the registry, a string naming a module is an arrow too).
"""
from __future__ import annotations

import pytest
import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]

# floor of each part of the house; an arrow may only go to the same floor or lower
FLOORS = {"technique": 0, "course": 1, "lessons": 2, "labs": 3, "bench": 4, "figures": 5, "cli": 6}
_TARGET = re.compile(r"minipar(?:\.\w+)+(?::\w+)?")


def layer(module: str) -> str:
    """The part of the house a module (``minipar.lessons.pipeline``) belongs to."""
    parts = module.split(".")
    if module == "minipar.course":
        return "course"
    if len(parts) > 1 and parts[1] in ("cli", "lessons", "labs", "bench", "figures"):
        return parts[1]
    if module == "minipar.__main__":
        return "cli"
    return "technique"


def read_tree(root: pathlib.Path = ROOT) -> dict[str, str]:
    """{module name: source} of every file of the minipar package."""
    out = {}
    for path in sorted((root / "minipar").rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path.read_text()
    return out


def _docstrings(tree) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def arrows(modules: dict[str, str]) -> dict[str, dict[str, int]]:
    """{module: {imported module: line}} for every import inside the package, at any depth."""
    def resolve(name):
        # the longest prefix of ``name`` that is a module of the tree
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    out = {}
    for mod, source in modules.items():
        tree = ast.parse(source)
        here = mod if _is_package(mod, modules) else mod.rpartition(".")[0]
        edges = {}
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                # ``from pkg import sub`` imports the submodule; ``from mod import name`` the module
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
                  and mod != "minipar.course" and _TARGET.fullmatch(node.value)):
                targets = [node.value.split(":")[0]]
            for t in targets:
                if not t.startswith("minipar"):
                    continue
                target = resolve(t)
                if target and target != mod:
                    edges.setdefault(target, node.lineno)
        out[mod] = edges
    return out


def _is_package(mod, modules):
    return any(m.startswith(mod + ".") for m in modules)


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def upward(graph: dict[str, dict[str, int]]) -> list[str]:
    """Every arrow from a lower floor to a higher one, as ``a (line) -> b: layer -> layer``."""
    bad = []
    for a, edges in sorted(graph.items()):
        for b, line in sorted(edges.items()):
            la, lb = layer(a), layer(b)
            if FLOORS[lb] > FLOORS[la]:
                bad.append(f"{a} (line {line}) imports {b}: {la} -> {lb}")
    return bad


def problems(modules: dict[str, str]) -> list[str]:
    graph = arrows(modules)
    return [f"import cycle: {' <-> '.join(c)}" for c in cycles(graph)] + upward(graph)


def test_the_house_has_no_cycles_and_no_arrow_runs_up():
    found = problems(read_tree())
    assert not found, "\n".join(found)


def _planted(edit_module, line):
    modules = read_tree()
    modules[edit_module] = modules[edit_module] + "\n\ndef _planted():\n    " + line + "\n"
    return problems(modules)


@pytest.mark.slow
def test_a_planted_back_edge_is_caught():
    # a technique reaching up into the CLI, inside a function body
    found = _planted("minipar.collectives", "from .cli import main")
    assert any("minipar.collectives" in p and "technique -> cli" in p for p in found), found
    # a lesson driver drawing
    found = _planted("minipar.lessons.pipeline", "import minipar.figures")
    assert any("lessons -> figures" in p for p in found), found
    # a technique launching a lesson driver by name
    found = _planted("minipar.pipeline.execute", 'return "minipar.lessons.pipeline:tour"')
    assert any("technique -> lessons" in p for p in found), found
    # a benchmark that draws
    found = _planted("minipar.bench.collectives", "from ..figures import collectives")
    assert any("bench -> figures" in p for p in found), found


@pytest.mark.slow
def test_a_planted_cycle_is_caught():
    # two techniques importing each other (no floor is crossed, so only the cycle rule sees it)
    modules = read_tree()
    modules["minipar.trace"] += "\n\ndef _planted():\n    from .collectives import all_reduce\n"
    found = problems(modules)
    assert any(p.startswith("import cycle") and "minipar.trace" in p for p in found), found
