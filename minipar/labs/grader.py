"""``minipar check NN``: grade a lab exercise on real ranks, with pinpointed feedback.

For every task of the lab, and for each world size in turn (1, 2, 3, 4: a non-power of two
included), the learner's function runs on real ranks (``minipar.launch``) inside the task's
check, which compares it with minipar's reference and returns *where* it differs: which
rank, which element or chunk, expected vs got, on the smallest failing case. The grader stops
a task at the first failing world size and reports:

* a wrong value:      the check's message (rank, element, expected vs got)
* an exception:       the rank and the last lines of its traceback
* a hang:             the watchdog's report of what every rank was blocked on
* ``NotImplementedError``: "not implemented yet"

Exit code 0 only when every selected task passes.

A lab is described by a module ``minipar.labs.labNN`` with ``TITLE``, ``FOLDER``, ``TASKS``
(a list of :class:`Task`) and ``SOLUTION`` (a module with the reference implementations).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import re
from dataclasses import dataclass

from ..launcher import LaunchError, launch

WORLD_SIZES = (1, 2, 3, 4)


@dataclass(frozen=True)
class Task:
    key: str  # "1.3"
    title: str
    function: str  # name the learner implements
    check: str  # "module:function" called on every rank as check(comm, fn) -> list of failure strings
    sizes: tuple = WORLD_SIZES


def load_lab(key: str):
    key = key.zfill(2)
    try:
        return importlib.import_module(f"minipar.labs.lab{key}")
    except ModuleNotFoundError:
        raise ValueError(f"no lab {key!r}: see `minipar lessons`") from None


def load_functions(path: str | None, solution: str | None):
    """The module whose functions are graded: the learner's file, or the reference."""
    if solution:
        return importlib.import_module(solution)
    spec = importlib.util.spec_from_file_location("exercise_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # the file's ``if __name__ == "__main__"`` demo does not run
    return mod


def grade_on_ranks(comm, task_check, function, path=None, solution=None):
    """Rank side: run one task's check on the learner's function; returns failure strings."""
    fn = getattr(load_functions(path, solution), function)
    module, _, name = task_check.partition(":")
    return getattr(importlib.import_module(module), name)(comm, fn)


def _explain(err: LaunchError, n: int, task: Task) -> str:
    out = err.output
    if "minipar watchdog" in out:
        report = out[out.index("minipar watchdog"):].splitlines()
        lines = [ln for ln in report if ln.startswith("  rank ")]
        return f"hangs on {n} ranks (deadlock or a send without its recv). The watchdog saw:\n" + "\n".join("        " + ln.strip() for ln in lines)
    if f'NotImplementedError: lab {task.key}' in out or "NotImplementedError" in out:
        return f"not implemented yet (raise NotImplementedError(\"lab {task.key}\") is still there)"
    tb = [ln for ln in out.splitlines() if ln.strip() and not ln.startswith(("Abort(", "application called"))]
    rank = re.search(r"rank (\d+)", out)
    where = f" (rank {rank.group(1)})" if rank else ""
    return f"raised an exception on {n} ranks{where}:\n" + "\n".join("        " + ln for ln in tb[-6:])


def grade_task(task: Task, path, solution, timeout: float):
    """(passed, message) for one task: the smallest world size that fails, or PASS."""
    for n in task.sizes:
        try:
            res = launch(n, grade_on_ranks, quiet=True, watchdog=timeout, job_timeout=timeout + 60,
                         task_check=task.check, function=task.function, path=path, solution=solution)
        except LaunchError as err:
            return False, _explain(err, n, task)
        failures = [f for rank in res.results for f in rank]
        if failures:
            return False, f"wrong on {n} rank{'s' if n > 1 else ''}: {failures[0]}" + (
                f"\n        (+{len(failures) - 1} more failing checks)" if len(failures) > 1 else "")
    return True, f"PASS on {', '.join(map(str, task.sizes))} ranks"


def main(args) -> int:
    lab = load_lab(args.lab)
    tasks = lab.TASKS
    if args.task:
        known = {t.key for t in tasks}
        unknown = [t for t in args.task if t not in known]
        if unknown:
            raise SystemExit(f"minipar check: no task {', '.join(unknown)} in lab {args.lab}; tasks: {', '.join(sorted(known))}")
        tasks = [t for t in tasks if t.key in args.task]
    if args.solution:
        path, solution, what = None, lab.SOLUTION, "minipar's reference implementation"
    else:
        path = os.path.abspath(args.file or os.path.join(lab.FOLDER, "exercise.py"))
        if not os.path.exists(path):
            raise SystemExit(f"minipar check: {path} not found (run from the repository root, or pass --file)")
        solution, what = None, path
    print(f"lab {lab.KEY}: {lab.TITLE}\ngrading {what}\n", flush=True)
    passed = 0
    for t in tasks:
        ok, msg = grade_task(t, path, solution, args.timeout)
        passed += ok
        print(f"  {t.key} {t.title:<28} {'PASS' if ok else 'FAIL'}  {msg if not ok else msg[5:]}", flush=True)
    print(f"\n{passed}/{len(tasks)} tasks pass")
    return 0 if passed == len(tasks) else 1
