"""Skeletons give contracts, not answers: no docstring or TODO of a lab's exercise.py spells out an
index formula such as ``(r - s - 1) % p``; a learner who is handed the index types it in instead of
working it out. The formulas live in the hints' later stages (``minipar check NN --hint T``).

Kept on purpose (contracts, not recipes): the placement rule "rank r on node r // R, local rank
r % R" in lab 01's 1.7 (it defines the emulated nodes, as ``mpiexec -hosts a:R,b:R`` does), and the
cost formulas lab 08's 8.1 grades (the model is the task's subject, given to be implemented).
"""
import ast
import pathlib
import re

import pytest

from minipar.course import labs

ROOT = pathlib.Path(__file__).resolve().parents[1]
# an arithmetic index taken modulo something: (r - s - 1) % p, (rank + 1) % size, (vr - k + root) % p
FORMULA = re.compile(r"\(\s*[\w.]+\s*[-+]\s*[\w.]+(?:\s*[-+]\s*[\w.]+)*\s*\)\s*%\s*[\w.]+")


def given_away(source: str) -> list[str]:
    """The index formulas ``source``'s docstrings and TODO comments spell out: '<where>: <formula>'."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)):
            found += [f"{getattr(node, 'name', 'the module')}: {m.group(0)}"
                      for m in FORMULA.finditer(ast.get_docstring(node) or "")]
    for i, line in enumerate(source.splitlines(), 1):
        if "TODO" in line:
            found += [f"line {i}: {m.group(0)}" for m in FORMULA.finditer(line)]
    return found


@pytest.mark.parametrize("lab", labs(), ids=lambda ls: ls.key)
def test_no_skeleton_gives_an_index_formula(lab):
    assert given_away((ROOT / lab.lab / "exercise.py").read_text()) == []


def test_a_formula_put_back_is_found():
    skeleton = (ROOT / "labs" / "01_collectives" / "exercise.py").read_text()
    planted = skeleton.replace('"""Return this rank\'s chunk of the elementwise sum of every rank\'s x.',
                               '"""Return this rank\'s chunk of the elementwise sum of every rank\'s x.\n\n'
                               '    In step s send chunk (r - s - 1) % p to the right.', 1)
    assert planted != skeleton
    assert given_away(planted) == ["ring_reduce_scatter: (r - s - 1) % p"]
    assert given_away("x = 1  # TODO(lab1.1): send to (comm.rank + 1) % comm.size\n") == [
        "line 1: (comm.rank + 1) % comm.size"]
