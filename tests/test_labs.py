"""Tests of the tests, for every lab in the course registry (minipar.course), on both backends
(NumPy over MPI, and torch tensors over torch.distributed: `minipar check NN --backend torch`):

* the skeleton fails every task ("not implemented yet");
* minipar's reference and a fully solved exercise (tests/labs/solved/, written as a learner
  would, graded through --file) pass every task;
* every planted-bug mutant (labs/NN_*/mutants/) and every solution that skips the technique
  (tests/labs/skips/: a builtin collective, the full weights everywhere, an all-reduce where a
  reduce-scatter is asked, state gathered through objects, ...) fails each task it targets,
  with its expected message in *that task's own* report; an attempt that only makes sense on one
  backend (mpi4py's own calls, torch.distributed's) says so in a ``BACKENDS: mpi`` line; a lab
  graded on one backend only (lab 09, torch's engines: ``Lesson.backends``) is tested on that one;
* skeletons import nothing that holds their answers, graders never import their solutions.
"""
import argparse
import ast
import importlib
import pathlib
import re
import subprocess
import sys

import pytest

from minipar.course import LESSONS, lab as lab_of, labs

ROOT = pathlib.Path(__file__).resolve().parents[1]
LABS = labs()
MUTANTS = sorted(m for ls in LABS for m in (ROOT / ls.lab / "mutants").glob("*.py"))
ATTEMPTS = ROOT / "tests" / "labs"
SKIPS = sorted((ATTEMPTS / "skips").glob("*.py"))
BACKENDS = ("mpi", "torch")


def on_backends(attempts):
    """(attempt, backend) for every backend the attempt is graded on: its ``BACKENDS:`` line, else
    every backend its lab is graded on for a mutant, and the lab's first (its default) for a
    skipping solution. A skip's rules (no builtin, exact traffic, the learner's own messages) run
    the same code on both backends, so each is graded on both only where the backends differ in
    what the rule reads (torch's builtins, its watched tensors, its memory count): there the skip
    says ``BACKENDS: mpi torch``. Mutants are graded on every backend of their lab."""
    out = []
    for path in attempts:
        named = re.search(r"^BACKENDS: ((?:mpi|torch)(?: (?:mpi|torch))*)", path.read_text(), re.M)
        mutant = path.parent.name == "mutants"
        graded_on = lab_of((path.parent.parent.name if mutant else path.name)[:2]).backends
        on = named.group(1).split() if named else graded_on if mutant else graded_on[:1]
        out += [pytest.param(path, b, id=f"{path.parent.parent.name}/{path.name}-{b}" if mutant
                             else f"{path.name}-{b}") for b in on]
    return out


def lab_backends(labs):
    """(lab, backend) for every backend each lab is graded on (``Lesson.backends``)."""
    return [pytest.param(ls, b, id=f"{ls.key}-{b}") for ls in labs for b in ls.backends if b in BACKENDS]


def solved(ls):
    return ATTEMPTS / "solved" / f"{pathlib.Path(ls.lab).name}.py"


def check(key, *args, timeout=600, cwd=ROOT):
    out = subprocess.run([sys.executable, "-m", "minipar", "check", key, *args], cwd=cwd,
                         capture_output=True, text=True, timeout=timeout)
    return out.returncode, out.stdout + out.stderr


def skeleton_fails_every_task(lab, cwd=ROOT, backend=None):
    """Grade the repository's skeleton by its path, from ``cwd``: every task "not implemented yet",
    whatever a learner has solved in a workspace there (``minipar check NN`` alone grades that).
    ``backend``: default, the lab's first."""
    code, out = check(lab.key, "--file", str(ROOT / lab.lab / "exercise.py"), "--backend", backend or lab.backends[0],
                      cwd=cwd)
    tasks = reports(out)
    assert code == 1 and tasks, out
    assert all(status == "FAIL" for status, _ in tasks.values()), out
    assert all("not implemented yet" in msg for _, msg in tasks.values()), out


def reports(text):
    """{task key: (PASS or FAIL, the task's own report: its line and the indented lines under it)}."""
    out, key = {}, None
    for line in text.splitlines():
        m = re.match(r"^  (\d+\.\d+) .*?(PASS|FAIL)  (.*)$", line)
        if m:
            key = m.group(1)
            out[key] = [m.group(2), m.group(3)]
        elif key and line.startswith("        "):
            out[key][1] += "\n" + line.strip()
        else:
            key = None
    return {k: tuple(v) for k, v in out.items()}


def failing_with(key, path, expected, timeout, backend="mpi"):
    """Grade ``path`` on the tasks of ``expected`` ({task: [messages]}) on ``backend``; each must
    fail with every one of its messages in its own report."""
    args = [a for t in expected for a in ("--task", t)]
    code, out = check(key, "--file", str(path), *args, "--timeout", str(timeout), "--backend", backend)
    got = reports(out)
    assert code == 1 and set(got) == set(expected), out
    for task, messages in expected.items():
        status, report = got[task]
        assert status == "FAIL", f"{path.name} passes task {task}:\n{out}"
        for message in messages:
            assert message in report, f"task {task}'s report lacks {message!r}:\n{report}"


@pytest.mark.mpi
@pytest.mark.timeout(600)
@pytest.mark.parametrize("lab, backend", lab_backends(LABS))
def test_skeleton_fails_every_task(lab, backend):
    skeleton_fails_every_task(lab, backend=backend)


@pytest.mark.mpi
@pytest.mark.timeout(600)
@pytest.mark.parametrize("how", ["--solution", "solved"])
@pytest.mark.parametrize("lab, backend", lab_backends(LABS))
def test_reference_and_solved_exercise_pass_every_task(lab, how, backend):
    code, out = check(lab.key, *(["--solution"] if how == "--solution" else ["--file", str(solved(lab))]),
                      "--backend", backend)
    tasks = reports(out)
    graded = importlib.import_module(lab.grader).TASKS
    assert code == 0 and set(tasks) == {t.key for t in graded}, out
    assert all(s == "PASS" for s, _ in tasks.values()), out


@pytest.mark.mpi
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mutant, backend", on_backends(MUTANTS))
def test_mutant_fails_with_a_pinpointed_message(mutant, backend):
    text = mutant.read_text()
    task = re.search(r"EXPECT_TASK: (\S+)", text).group(1)
    messages = [m.strip() for m in re.findall(r"^EXPECT_MESSAGE: (.+)$", text, re.M)]
    assert messages, f"{mutant} names no EXPECT_MESSAGE"
    failing_with(mutant.parent.parent.name[:2], mutant, {task: messages}, timeout=4, backend=backend)


@pytest.mark.mpi
@pytest.mark.timeout(600)
@pytest.mark.parametrize("attempt, backend", on_backends(SKIPS))
def test_skipping_the_technique_fails_every_targeted_task(attempt, backend):
    expected = {}
    for task, message in re.findall(r"^EXPECT (\d+\.\d+): (.+)$", attempt.read_text(), re.M):
        expected.setdefault(task, []).append(message.strip())
    assert expected, f"{attempt} names no EXPECT line"
    failing_with(attempt.name[:2], attempt, expected, timeout=10, backend=backend)


def test_every_lab_has_skipping_attempts_and_a_solved_exercise():
    for ls in LABS:
        assert solved(ls).exists(), f"no solved exercise for lab {ls.key}: {solved(ls)}"
        assert any(p.name.startswith(ls.key) for p in SKIPS), f"no solution skipping lab {ls.key}'s technique"


def _imports(tree, skip_main=False):
    """Module names imported in ``tree`` (``from a import b`` gives a and a.b)."""
    names = []
    for node in ast.walk(tree):
        if skip_main and isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            for child in ast.walk(node):
                child._main = True
    for node in ast.walk(tree):
        if getattr(node, "_main", False):
            continue
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return names


@pytest.mark.parametrize("lab", LABS, ids=lambda ls: ls.key)
def test_skeleton_imports_nothing_that_holds_its_answers(lab):
    """No module the skeleton imports (outside its ``__main__`` demo) defines a task function
    of the lab, or is where minipar's answer to a task lives."""
    tasks = [t.function for t in importlib.import_module(lab.grader).TASKS]
    solution = importlib.import_module(lab.solution)
    answers = {lab.solution} | {getattr(solution, f).__module__ for f in tasks}
    tree = ast.parse((ROOT / lab.lab / "exercise.py").read_text())
    for name in _imports(tree, skip_main=True):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue  # ``from a import function``: a.function is not a module
        assert name not in answers, f"{lab.lab}/exercise.py imports {name}, where a task's answer lives"
        held = [f for f in tasks if hasattr(mod, f)]
        assert not held, f"{lab.lab}/exercise.py imports {name}, which holds the answers {held}"


@pytest.mark.parametrize("lab", LABS, ids=lambda ls: ls.key)
def test_grader_never_imports_its_solution(lab):
    tree = ast.parse(pathlib.Path(importlib.import_module(lab.grader).__file__).read_text())
    short = lab.solution.rsplit(".", 1)[1]
    assert not [n for n in _imports(tree) if short in n], f"{lab.grader} imports {lab.solution}"


def test_registry_names_every_part_of_every_lesson():
    from minipar.cli import build_parser

    def verbs(parser):
        return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices

    run = verbs(verbs(build_parser())["run"])
    for ls in LESSONS:
        for package in ls.packages:
            importlib.import_module(package)
        assert ls.run in run, f"lesson {ls.key}: no `minipar run {ls.run}`"
        importlib.import_module(ls.driver.partition(":")[0])
        if ls.lab:
            for part in ("README.md", "exercise.py", "mutants"):
                assert (ROOT / ls.lab / part).exists(), f"{ls.lab}/{part}"
            grader, solution = importlib.import_module(ls.grader), importlib.import_module(ls.solution)
            assert grader.TITLE and grader.TASKS
            for t in grader.TASKS:
                assert callable(getattr(solution, t.function, None)), f"{ls.solution} lacks {t.function}"


RING_PASS = """
import numpy as np


def ring_pass(comm, x):
    buf = np.empty_like(x)
    return comm.sendrecv(x, (comm.rank + 1) % comm.size, buf, (comm.rank - 1) % comm.size)
"""


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_a_stuck_task_is_ended_at_its_budget_with_the_line_it_was_running(tmp_path):
    """A task that sleeps outside any communication used to wait out the job's hard limit on every
    world size (minutes, then "raised an exception" with no line); now its budget ends it."""
    import time

    path = tmp_path / "stuck.py"
    path.write_text(RING_PASS.replace("    buf = np.empty_like(x)\n", "    import time\n    time.sleep(600)\n    buf = np.empty_like(x)\n"))
    budget = next(t.budget for t in importlib.import_module("minipar.labs.lab01").TASKS if t.key == "1.1")
    t0 = time.monotonic()
    code, out = check("01", "--file", str(path), "--task", "1.1", "--task", "1.6")
    took = time.monotonic() - t0
    status, report = reports(out)["1.1"]
    assert code == 1 and status == "FAIL" and reports(out)["1.6"][0] == "FAIL", out
    assert report.startswith(f"task 1.1 did not finish in {budget:g} s on 1 rank (a loop that never ends, or a "
                             f"sleep?): rank 0 was running Python, not communicating, at {path}:7: time.sleep(600)"), out
    assert "1 ranks" not in out and took < budget + 60, f"{took:.0f} s:\n{out}"


@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.parametrize("where, code, said", [
    ("task", "sys.exit(3)", "exited on 1 rank (rank 0): sys.exit(3) at {path}:7: sys.exit(3), inside ring_pass: a "
                            "graded function returns its result, it never ends the process"),
    ("task", "os._exit(0)", "the exercise exited without finishing task 1.1, on 1 rank (os._exit, a signal or a "
                            "crash: no exception was raised; exit code 0)"),
    ("import", "sys.exit(0)", "the exercise ended the process while it was imported (rank 0): sys.exit(0) at "
                              "{path}:4: sys.exit(0); nothing can be graded"),
    ("import", "os._exit(0)", "the exercise exited while it was imported, on 1 rank"),
], ids=["sys.exit in a task", "os._exit in a task", "sys.exit at import", "os._exit at import"])
def test_an_exercise_that_exits_is_reported_with_its_line_or_its_task(tmp_path, where, code, said):
    path = tmp_path / "exits.py"
    body = RING_PASS.replace("import numpy as np\n", f"import os, sys\nimport numpy as np\n{code}\n" if where == "import"
                             else "import os, sys\nimport numpy as np\n")
    if where == "task":
        body = body.replace("    buf = np.empty_like(x)\n", f"    {code}\n    buf = np.empty_like(x)\n")
    path.write_text(body)
    status, report = reports(check("01", "--file", str(path), "--task", "1.1")[1])["1.1"]
    assert status == "FAIL" and report.startswith(said.format(path=path)), report


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_verbose_shows_every_failing_check_of_a_task():
    path, args = ATTEMPTS / "skips" / "01_minipar_reference.py", ("--task", "1.3", "--timeout", "10")
    quiet, verbose = (reports(check("01", "--file", str(path), *args, *more)[1])["1.3"][1] for more in ((), ("-v",)))
    assert "(+1 more failing checks: -v shows them)" in quiet and "rank 1's" not in quiet, quiet
    assert "more failing checks" not in verbose and "rank 1's " in verbose, verbose


def test_check_refuses_an_unknown_lab_or_task_in_one_line():
    for args, what in ((["99"], "no lab '99': the labs are 01, 02"),
                       (["01", "--task", "9.9"], "--task 9.9: lab 01 has tasks 1.1"),
                       (["09", "--backend", "mpi"], "lab 09 is graded on torch only, not on mpi (drop --backend mpi)")):
        code, out = check(*args, timeout=60)
        assert code == 2 and what in out and "Traceback" not in out and len(out.strip().splitlines()) == 1, out
