"""The house's layers, read from the source of ``minipar/lessons/``: a lesson driver checks.

It registers no verb (the command line's job), draws no figure (``minipar/figures/``) and runs no
benchmark (``minipar/bench/``); and every module of ``lessons/`` is one lesson's driver in the
course registry, or the shared harness. The only argument parser allowed is the tiny
``main(argv)`` that ``python -m minipar.lessons.X`` runs under mpiexec or torchrun.
"""
import ast
import pathlib

from minipar.course import LESSONS

ROOT = pathlib.Path(__file__).resolve().parents[1]
LESSONS_DIR = ROOT / "minipar" / "lessons"
SHARED = {"__init__", "common", "fixtures", "torch_fixtures"}  # the package, the check harness, lessons 04's and 09's models and data
ENTRY = "main"  # python -m minipar.lessons.X: the mpiexec entry


def modules():
    return sorted(LESSONS_DIR.glob("*.py"))


def imports(path):
    """(line, absolute module name, inside which top-level function or None) of every import in ``path``,
    function-level ones included; ``from X import a`` also yields ``X.a`` (a module or a name in it)."""
    tree = ast.parse(path.read_text())
    package = ["minipar", "lessons"]
    out = []

    def visit(node, function):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name, function) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]).strip(".") \
                if node.level else node.module
            out.append((node.lineno, base, function))
            out.extend((node.lineno, f"{base}.{a.name}", function) for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    for node in tree.body:
        visit(node, node.name if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None)
    return tree, out


def under(name, *prefixes):
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def where(path, line):
    return f"{path.relative_to(ROOT)}:{line}"


def uses(packages, target, call=None):
    """Where a lessons/ module imports one of ``packages``, launches a ``target...:f``, or calls ``.call``."""
    found = []
    for path in modules():
        tree, imps = imports(path)
        found += [f"{where(path, ln)}: imports {name}" for ln, name, _ in imps if under(name, *packages)]
        for node in ast.walk(tree):
            if call and isinstance(node, ast.Attribute) and node.attr == call:
                found.append(f"{where(path, node.lineno)}: .{call}()")
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(target) \
                    and ":" in node.value:
                found.append(f"{where(path, node.lineno)}: launches {node.value}")
    return found


def test_no_lesson_module_registers_a_verb():
    found = []
    for path in modules():
        tree, imps = imports(path)
        found += [f"{where(path, ln)}: imports {name}" for ln, name, _ in imps if under(name, "minipar.cli")]
        found += [f"{where(path, ln)}: imports argparse outside {ENTRY}()" for ln, name, fn in imps
                  if name == "argparse" and fn != ENTRY]
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and (node.name.startswith(("add_", "cmd_")) and "command" in node.name
                                                      or node.name in ("run_command", "run_cmd")):
                found.append(f"{where(path, node.lineno)}: defines {node.name}, a verb or its handler")
        for node in (n for top in tree.body if getattr(top, "name", None) != ENTRY for n in ast.walk(top)):
            if isinstance(node, ast.Attribute) and node.attr in ("add_subparsers", "add_parser", "set_defaults"):
                found.append(f"{where(path, node.lineno)}: .{node.attr}(), a verb")
    assert not found, "a lesson driver registers no verb (minipar/cli does):\n" + "\n".join(found)


def test_no_lesson_module_draws_a_figure():
    found = uses(("matplotlib", "minipar.figures"), "minipar.figures.", call="savefig")
    assert not found, "a lesson driver draws no figure (minipar/figures does):\n" + "\n".join(found)


def test_no_lesson_module_runs_a_benchmark():
    found = uses(("minipar.bench",), "minipar.bench.")
    assert not found, "a lesson driver runs no benchmark (minipar/bench does):\n" + "\n".join(found)


def test_every_lesson_module_is_a_driver_of_a_lesson_in_the_registry():
    named = {d for ls in LESSONS for d in ls.drivers}
    on_disk = {f"minipar.lessons.{p.stem}" for p in modules() if p.stem not in SHARED}
    assert not on_disk - named, f"in minipar/lessons/ but no lesson's drivers in course.py: {sorted(on_disk - named)}"
    assert not named - on_disk, f"named in course.py but not a driver module: {sorted(named - on_disk)}"
    for ls in LESSONS:  # the tour's entry is one of the lesson's own drivers
        assert ls.driver.partition(":")[0] in ls.drivers, (ls.key, ls.driver, ls.drivers)
