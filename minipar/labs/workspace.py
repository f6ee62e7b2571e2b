"""The learner's side of a lab: a workspace to edit, hints in stages, the answer on request.

``minipar lab start 01`` copies lab 01's skeleton (its ``exercise.py``) into
``./minipar-labs/01_collectives/``, under the folder the command runs in; ``minipar check 01``
grades that copy (``--file`` grades another file). The repository's ``labs/*/exercise.py`` are
never written by any command: they stay the skeletons the tests grade, however much of the
course a learner has solved.

``minipar check 01 --hint 1.3`` prints the next hint of task 1.3 that the learner has not seen
(each task has two or three, from a nudge to near-pseudocode: ``HINTS`` in the lab's grader
module); the stage reached is kept in the workspace, in ``.hints.json``.
``minipar lab solution 01 --task 1.3`` prints minipar's answer: the solution module's function,
and the source of minipar's functions it calls.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import json
import shutil
import sys
import textwrap
from pathlib import Path

from ..course import Lesson, lab
from ..errors import UsageError

ROOT = Path(__file__).resolve().parents[2]  # the repository: labs/ sits beside minipar/
HOME = Path("minipar-labs")  # where workspaces go, under the folder the command runs in
EDITED = ("exercise.py",)  # what a learner edits in a lab (the README stays in the repository, its links work there)
SEEN = ".hints.json"  # {task: the last hint stage shown}, in the workspace


def skeleton(ls: Lesson) -> Path:
    """The lab's folder in the repository (README.md, exercise.py, mutants/)."""
    folder = ROOT / ls.lab
    if not (folder / "exercise.py").exists():
        raise UsageError(f"{folder / 'exercise.py'} not found: the labs come with the repository "
                         f"(git clone it, then pip install -e .)")
    return folder


def home(cwd: Path | None = None) -> Path:
    """The ``minipar-labs`` folder workspaces go in, relative to where the command runs: ``./minipar-labs``,
    or, run from inside one (``minipar-labs`` itself, or a workspace in it), that one: a learner who
    ``cd``'d into a workspace gets the same workspaces, never a ``minipar-labs`` nested inside it."""
    cwd = (cwd or Path.cwd()).resolve()
    for k, folder in enumerate((cwd, *cwd.parents)):
        if folder.name == HOME.name:
            return Path(*[".."] * k) if k else Path(".")
        if k == 1:
            break
    return HOME


def default_folder(ls: Lesson) -> Path:
    """``minipar-labs/01_collectives``: the workspace ``lab start`` makes and ``check`` grades (seen
    from inside ``minipar-labs/02_...``, ``../01_collectives``; from inside its own folder, ``.``)."""
    folder = home() / Path(ls.lab).name
    return Path(".") if folder.resolve() == Path.cwd().resolve() else folder


def start(key: str, folder: str | None = None, force: bool = False) -> tuple[Lesson, list[Path]]:
    """Copy lab ``key``'s skeleton files into ``folder`` (default :func:`default_folder`, created).
    Refuses, before copying anything, when one of them exists there, unless ``force``."""
    ls = lab(key)
    source = skeleton(ls)
    target = Path(folder) if folder else default_folder(ls)
    if target.resolve() == source.resolve() or source.resolve() in target.resolve().parents:
        raise UsageError(f"{target} is the repository's lab folder: a workspace goes elsewhere "
                         f"(the default is {default_folder(ls)})")
    if target.exists() and not target.is_dir():
        raise UsageError(f"{target} exists and is not a folder")
    there = [target / name for name in EDITED if (target / name).exists()]
    if there and not force:
        inside = " (you are in this workspace: grade it with `minipar check " + ls.key + "`)" if target == Path(".") else ""
        raise UsageError(f"{there[0]} exists (your work?){inside}: keep it, or replace it with the skeleton: --force")
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for name in EDITED:
        shutil.copyfile(source / name, target / name)
        written.append(target / name)
    return ls, written


def graded_file(ls: Lesson, file: str | None = None) -> Path:
    """What ``minipar check`` grades: ``file`` when given, else the workspace's exercise.py at
    its default place; a one-line UsageError when neither exists."""
    if file:
        path = Path(file)
        if not path.is_file():
            raise UsageError(f"--file {file}: no such file")
        return path.resolve()
    path = default_folder(ls) / "exercise.py"
    if not path.is_file():
        raise UsageError(f"no workspace here ({path} not found): start one with `minipar lab start {ls.key}` "
                         f"(or grade a file: --file PATH)")
    return path.resolve()


# ---------------------------------------------------------------- hints

def tasks(ls: Lesson):
    """The lab's tasks, from its grader (``TASKS``), with their hints (``HINTS``)."""
    grader = importlib.import_module(ls.grader)
    return grader.TASKS, getattr(grader, "HINTS", {})


def task_of(ls: Lesson, key: str):
    found = [t for t in tasks(ls)[0] if t.key == key]
    if not found:
        raise UsageError(f"lab {ls.key} has no task {key!r}; its tasks: {', '.join(t.key for t in tasks(ls)[0])}")
    return found[0]


def hint_memory(ls: Lesson, file: str | None = None) -> Path | None:
    """Where the stages seen are kept: the workspace of the file ``check`` would grade, or None
    when there is none (or it is the repository's own lab folder, which no command writes)."""
    try:
        folder = graded_file(ls, file).parent
    except UsageError:
        return None
    return None if folder == skeleton(ls).resolve() else folder / SEEN


def hint(key: str, task: str, stage: int | None = None, file: str | None = None):
    """(lesson, task, stage shown, number of stages, its text, where the stage is remembered or
    None, whether it is the furthest stage seen). Without ``stage``: the first stage not yet seen
    (the last one again once all are)."""
    ls = lab(key)
    t = task_of(ls, task)
    stages = tasks(ls)[1].get(task, ())
    if not stages:
        raise UsageError(f"lab {ls.key} has no hints for task {task}")
    memory = hint_memory(ls, file)
    seen = json.loads(memory.read_text()) if memory and memory.exists() else {}
    if stage is None:
        stage = min(seen.get(task, 0) + 1, len(stages))
    elif not 1 <= stage <= len(stages):
        raise UsageError(f"--stage {stage}: task {task} has hints 1 to {len(stages)}")
    seen[task] = max(seen.get(task, 0), stage)
    if memory:
        memory.write_text(json.dumps(seen, indent=1, sort_keys=True) + "\n")
    return ls, t, stage, len(stages), inspect.cleandoc(stages[stage - 1]), memory, seen[task] == stage


# ---------------------------------------------------------------- the answer

def where(obj) -> str:
    """``minipar/collectives.py:42`` (the path from the repository when it is in it)."""
    path = Path(inspect.getsourcefile(obj)).resolve()
    line = inspect.getsourcelines(obj)[1]
    return f"{path.relative_to(ROOT) if ROOT in path.parents else path}:{line}"


def called(fn) -> list:
    """minipar's functions and classes that ``fn`` calls by name (``all_gather(...)``,
    ``C.all_reduce(...)``), in the order they first appear."""
    out = []
    scope = getattr(fn, "__globals__", None) or vars(sys.modules[fn.__module__])  # a class: its module's names
    calls = [n for n in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(fn)))) if isinstance(n, ast.Call)]
    for node in sorted(calls, key=lambda n: (n.lineno, n.col_offset)):
        f, obj = node.func, None
        if isinstance(f, ast.Name):
            obj = scope.get(f.id)
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            owner = scope.get(f.value.id)
            obj = (getattr(owner, f.attr, None) if inspect.ismodule(owner)
                   else owner if inspect.isclass(owner) and f.attr == "apply" else None)  # an autograd.Function's
        mine = (inspect.isfunction(obj) or inspect.isclass(obj)) and (obj.__module__ or "").startswith("minipar.")
        if mine and obj is not fn and obj not in out:
            out.append(obj)
    return out


def solution(key: str, task: str | None = None):
    """[(task, (where, source) of the solution's function, [(name, where, source or None for a
    class) of what it calls])] for ``task``, or for every task of the lab. What it calls: minipar's
    functions and classes it names, then the private helpers those call (where minipar's
    collectives keep their loops)."""
    ls = lab(key)
    chosen = [task_of(ls, task)] if task else tasks(ls)[0]
    module = importlib.import_module(ls.solution)
    out = []
    for t in chosen:
        fn = getattr(module, t.function)
        shown = [c for c in called(fn) if c.__module__ != "minipar.xp"]  # xp: array plumbing, no answer
        for c in list(shown):  # and the private helpers a function keeps its loop in (collectives' _ring_...)
            if inspect.isfunction(c):  # and the solution's own classes they apply (lab 09's f: its autograd.Function)
                shown += [h for h in called(c) if h not in shown and (h.__name__.startswith("_") and inspect.isfunction(h)
                                                                      or inspect.isclass(h) and h.__module__ == module.__name__)]
        calls = [(f"{c.__module__}.{c.__qualname__}", where(c),
                  None if inspect.isclass(c) and c.__module__ != module.__name__ else inspect.getsource(c))
                 for c in shown]  # a class of the solution's own (an autograd.Function) is part of the answer
        out.append((t, (where(fn), inspect.getsource(fn)), calls))
    return ls, out
