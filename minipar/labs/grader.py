"""``minipar check NN``: grade a lab exercise on real ranks, with pinpointed feedback.

For each world size in turn (1, 2, 3, 4: a non-power of two included), every task still
passing runs on real ranks (``minipar.launch``, one job per world size) inside its check, which
compares the learner's function with minipar's reference and with the technique the task
teaches (``minipar.labs.checks``: values, no engine builtin, exact traffic, messages the
learner's own, own data only, memory held) and returns *where* it differs: which rank, which
element or chunk, which rule. While the learner's function runs, a call into minipar's own answer
(the solution module's function for the task, or the functions a task names as ``reference``)
is seen and refused.
A task stops at its first failing world size; a failing task is graded again on its own, so
its message never depends on the other tasks. The report per task:

* a wrong value or a broken rule: the check's message
* an exception:          the rank that raised it, the learner's innermost line in its traceback
  (file, line, source; also when it was raised deep inside ``comm``), and the exception
* a crash (an engine's C++ abort, as gloo's on a message larger than its buffer; a segfault):
  the same, from the stack the rank wrote as it died (``minipar.launcher.crash_reports``)
* a hang:                the watchdog's report of what every rank was blocked on
* stuck outside any communication (a loop that never ends, a sleep): "did not finish in N s",
  with the line each rank was running. Every task has a time budget (``Task.budget``, fitted to
  the reference: seconds per job on a loaded 2-core machine, with room to spare); the watchdog
  ends the job when a rank is still inside the task past it. The exercise's import has the
  budget of the job's tasks too (a sleep or a loop at the top of the file)
* a rank whose memory grew by more than ``MEMORY`` megabytes inside a task (a loop that never
  ends and allocates): "ran out of its memory", with the rank and its line
* the exercise ending the process (``sys.exit`` in a task or at import: the line that called it;
  ``os._exit``: the task it was running)
* ``NotImplementedError``: "not implemented yet"

Each rank writes what it is doing (loading the exercise, which task) into a file of a folder the
grader owns, so when a job dies the grader knows the task that killed it: that task gets its
verdict, and the others of its job run again together.

Exit code 0 only when every selected task passes.

What it grades: ``--file``'s exercise, else the learner's workspace copy at
``./minipar-labs/NN_topic/exercise.py`` (``minipar lab start NN`` makes it; without one, a line
says so); ``--solution`` grades minipar's reference. The repository's ``labs/NN_*/exercise.py``
is the skeleton: the tests grade it with ``--file``, and no command writes it.

A lab is one entry of ``minipar.course.LESSONS`` (its folder, grader and solution modules, and the
backends it is graded on: ``Lesson.backends``, the first the default; lab 09 is graded on torch
only, and ``--backend mpi`` is refused in one line before any rank starts); its grader module
defines ``TITLE`` and ``TASKS`` (a list of :class:`Task`).
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass

from ..comm.watchdog import user_line
from ..errors import UsageError
from ..launcher import LaunchError, ending_on_signals, launch
from ..trace import Event, clock_offset, write_chrome_trace
from .checks import Answers, ranks
from .verdicts import FINAL, MEMORY, cause, culprit, explain, not_implemented, read_doing
from .workspace import graded_file

WORLD_SIZES = (1, 2, 3, 4)
IMPORT = "the import of the exercise"  # the watchdog's name for the budget of load_functions
TRACE = "trace events"  # grade_on_ranks' key (never a task's) for the graded calls' events, with --trace
ALONE, AGAIN = "grade alone", "grade again"  # run_tasks' verdicts that are not yet a message


@dataclass(frozen=True)
class Task:
    key: str  # "1.3"
    title: str
    function: str  # name the learner implements
    check: str  # "module:function" called on every rank as check(comm, fn) -> list of failure strings
    sizes: tuple = WORLD_SIZES
    budget: float = 15.0  # seconds its check may run on one world size (most take under 1.5 s, loaded)
    reference: tuple = ()  # "module:function" of minipar's own answer: the learner's function may not run it
    tier: str = "guided"  # "guided": the technique's pieces, each from its docstring's contract and hints;
    #                       "core": the learner writes the technique's communication whole, from a contract


# torch's per-call cost (a tensor operation, a gloo message) is a few times NumPy's and MPI's for the
# small arrays a check uses: measured, lab 05's 5.6 takes about 14.6 s on torch where it takes 3 s on
# MPI (2 and 4 ranks, loaded), so a task's budget, fitted on MPI, is this much longer on torch
TORCH_BUDGET = 2.0


def budget(task: Task, backend: str) -> float:
    """Seconds ``task``'s check may run on one world size, on ``backend``."""
    return task.budget * (TORCH_BUDGET if backend == "torch" else 1.0)


def load_lab(key: str):
    """(the course's Lesson, its grader module) for lab ``key``; UsageError if there is none."""
    from ..course import lab

    ls = lab(key)
    return ls, importlib.import_module(ls.grader)


def load_functions(path: str | None, solution: str | None):
    """The module whose functions are graded: the learner's file, or the reference."""
    if solution:
        return importlib.import_module(solution)
    spec = importlib.util.spec_from_file_location("exercise_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # the file's ``if __name__ == "__main__"`` demo does not run
    return mod


def exercise_module(path: str):
    """The learner's exercise at ``path``, imported for a benchmark (``bench collectives --file``);
    a one-line UsageError (what it raised, at which line of the file; no traceback) when it does
    not import."""
    try:
        return load_functions(path, None)
    except (Exception, SystemExit) as err:
        line, tb = getattr(err, "lineno", None) if isinstance(err, SyntaxError) else None, err.__traceback__
        while tb is not None:  # the deepest frame in the learner's file
            if os.path.abspath(tb.tb_frame.f_code.co_filename) == os.path.abspath(path):
                line = tb.tb_lineno
            tb = tb.tb_next
        said = err.msg if isinstance(err, SyntaxError) else str(err)
        raise UsageError(f"{path} does not import" + (f" (line {line})" if line else "")
                         + f": {type(err).__name__}: {said}") from None


def not_yours(fn, function):
    """A learner's graded function must be written in their file, not taken from minipar."""
    module = getattr(fn, "__module__", None) or ""
    if module == "minipar" or module.startswith("minipar."):
        return [f"{function} is minipar's own {module}.{getattr(fn, '__qualname__', function)}, imported into "
                f"the exercise: write {function} yourself"]
    return []


# ---------------------------------------------------------------- on the ranks

class Doing:
    """What this rank is doing, in ``folder/rank.<r>`` (read by the grader when the job dies):
    "loading" (importing the exercise), "task 1.3", "done", or "exited <what>: <how>"."""

    def __init__(self, folder, rank):
        self.path = os.path.join(folder, f"rank.{rank}") if folder else None

    def __call__(self, what):
        if self.path:
            with open(self.path, "w") as f:
                f.write(what)

    def exited(self, what, stop: SystemExit):
        """The exercise raised SystemExit (``sys.exit``) during ``what``: write where, then end the
        whole job now (a rank left waiting for this one would only hang)."""
        tb = stop.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        where = user_line(tb.tb_frame)
        code = "" if stop.code is None else repr(stop.code)
        self(f"exited {what}: sys.exit({code})" + (f" at {where}" if where else ""))
        raise RuntimeError(f"the exercise called sys.exit({code}) during {what}") from None


class Kept:
    """``minipar check --trace``: every graded call's events on this rank, kept by task.

    ``checks.graded`` clears the tracer before each call of the learner's function; while a Kept
    is open that clear first keeps what the call before recorded, with a ``collective`` event
    around it ("task 1.5 on 4 ranks: ring_all_reduce, graded call 2") and each event's name
    labelled with the task and the learner's line that made the call."""

    def __init__(self, comm):
        self.comm, self.tracer, self.events = comm, comm.tracer, {}
        self.key = self.label = None
        self.calls, self.t0 = 0, time.perf_counter()

    def __enter__(self):
        self.tracer.clear = self.keep  # this tracer's clear, until __exit__
        return self

    def __exit__(self, *exc):
        self.keep()
        del self.tracer.clear
        return False

    def task(self, key, function):
        self.keep()
        self.key, self.label, self.calls = key, f"task {key} on {ranks(self.comm.size)}: {function}", 0
        self.events.setdefault(key, [])

    def keep(self):
        got, rank = list(self.tracer.events), self.tracer.rank
        if got and self.key is not None:
            self.calls += 1
            self.events[self.key].append(Event(rank, "collective", f"{self.label}, graded call {self.calls}",
                                               self.t0, max(e.t_end for e in got), 0, -1))
            self.events[self.key] += [e._replace(name=f"{e.name}, task {self.key}{_line(e.origin)}", origin=())
                                      for e in got]
        type(self.tracer).clear(self.tracer)
        self.t0 = time.perf_counter()  # the next graded call starts now

    def merged(self):
        """{task key: every rank's events on rank 0's clock} on rank 0, None elsewhere (collective)."""
        shift = clock_offset(self.comm) if self.comm.size > 1 else 0.0
        mine = {k: [e._replace(t_start=e.t_start + shift, t_end=e.t_end + shift) for e in evs]
                for k, evs in self.events.items()}
        everyone = self.comm.builtin.gather_object(mine, 0)
        if self.comm.rank:
            return None
        return {k: sorted((e for d in everyone for e in d.get(k, ())), key=lambda e: (e.t_start, e.rank))
                for k in mine}


def _line(origin) -> str:
    """", exercise.py:42" for the user's line that made a call (the last frame of its origin)."""
    return f", {os.path.basename(origin[-1][0])}:{origin[-1][1]}" if origin else ""


def grade_on_ranks(comm, checks, path=None, solution=None, batch=False, folder=None, keep=False):
    """Rank side: run each (task key, check, function name, budget, answers) in turn on the
    learner's functions; returns {task key: failure strings}, or for a task whose function raised
    NotImplementedError (batch jobs only; alone it ends the job like any exception): "not
    implemented: <its text>" when every rank raised it, "unclear" when only some did (then it is
    graded again alone). ``answers``: minipar's answers the learner's function may not run
    (:class:`minipar.labs.checks.Answers`), watched only when grading a learner's file.
    ``keep``: also {task key: its graded calls' events, every rank's} under ``TRACE`` on rank 0
    (not ``trace``: that is :func:`minipar.launch`'s own, which would trace the grader too)."""
    kept = Kept(comm) if keep else None
    with kept or contextlib.nullcontext():
        out = _grade_on_ranks(comm, checks, path, solution, batch, folder, kept)
    if kept is not None:
        out[TRACE] = kept.merged()
    return out


def _grade_on_ranks(comm, checks, path, solution, batch, folder, kept):
    doing = Doing(folder, comm.rank)
    doing("loading")
    try:  # an import that never ends (a sleep, a loop at the top of the file) is stopped like a task
        with comm.watchdog.within(IMPORT, min(c[3] for c in checks), MEMORY):
            functions = load_functions(path, solution)
    except SystemExit as stop:
        doing.exited("loading", stop)
    sync = comm.split(0, comm.rank, name="grader") if batch else None  # its own context: never meets a check's
    out = {}
    for key, check, function, budget, answers in checks:
        fn = getattr(functions, function, None)
        if fn is None:
            out[key] = [f"the exercise defines no function {function}"]
            continue
        if path:
            out[key] = not_yours(fn, function)
            if out[key]:
                continue
        module, _, name = check.partition(":")
        doing(f"task {key}")
        if kept is not None:
            kept.task(key, function)
        try:
            with comm.watchdog.within(f"task {key}", budget, MEMORY), Answers(answers, path) as ran:
                out[key] = getattr(importlib.import_module(module), name)(comm, fn)
            out[key] = out[key] or ran.refused(function)
            missing = None
        except NotImplementedError as err:
            if sync is None:
                raise
            missing = f"not implemented: {err}"
        except SystemExit as stop:
            doing.exited(f"task {key}", stop)
        doing("done")
        if sync is not None:
            everyone = sync.builtin.allgather_object(missing)
            if any(everyone):
                out[key] = missing if all(everyone) else "unclear"
    return out


# ---------------------------------------------------------------- the jobs

def run_tasks(tasks, n, path, solution, timeout, answers=None, verbose=False, backend="mpi", device=None,
              traces=None):
    """Grade ``tasks`` on n ranks in one job: ({task key: failure message, None (passed), ALONE
    (grade it again alone) or AGAIN (the job died before its verdict: grade it again with the
    others)}, whether the job ran to its end). ``answers``: the lab's solution module, whose
    function for a task the learner's may not run (nor the task's ``reference``). ``traces``: a
    dict that, when the job runs to its end, gets {task key: its graded calls' events}, replacing
    what an earlier job put there."""
    with ending_on_signals():  # SIGTERM, SIGHUP: the ranks' files go before this process does
        folder = tempfile.mkdtemp(prefix="minipar-check-")
        try:
            res = launch(n, grade_on_ranks, backend=backend, device=device, quiet=True, watchdog=timeout,
                         job_timeout=timeout + 60 + sum(budget(t, backend) for t in tasks),
                         checks=[(t.key, t.check, t.function, budget(t, backend),
                                  ((f"{answers}:{t.function}",) if answers else ()) + t.reference) for t in tasks],
                         path=path, solution=solution, batch=len(tasks) > 1, folder=folder,
                         keep=traces is not None)
        except LaunchError as err:
            return died(err, tasks, n, read_doing(folder, n)), False
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    if traces is not None:
        traces.update(res.results[0][TRACE])
    verdict = {}
    for t in tasks:
        per_rank = [rank[t.key] for rank in res.results]
        if "unclear" in per_rank:
            verdict[t.key] = ALONE
        elif isinstance(per_rank[0], str):
            verdict[t.key] = not_implemented(t, per_rank[0].partition(": ")[2])
        else:
            failures = [f for rank in per_rank for f in rank]
            more = ("".join(f"\n        {f}" for f in failures[1:]) if verbose else
                    f"\n        (+{len(failures) - 1} more failing checks: -v shows them)")
            verdict[t.key] = None if not failures else (
                f"wrong on {ranks(n)}: {failures[0]}" + (more if len(failures) > 1 else ""))
    return verdict, True


def died(err, tasks, n, doing):
    """The verdicts of a job that died: the task that killed it gets its message (or ALONE after
    an exception or a hang: graded again alone, its message is then its own), the others AGAIN;
    all ALONE when the task is unknown; all the same message when the exercise's import died."""
    key = culprit(err, doing, [t.key for t in tasks])
    if len(tasks) == 1 or key == "loading":
        return {t.key: explain(err, n, t, doing) for t in tasks}
    if key is None:
        return {t.key: ALONE for t in tasks}
    final = cause(err, doing) in FINAL
    return {t.key: AGAIN if t.key != key else explain(err, n, t, doing) if final else ALONE for t in tasks}


def grade(tasks, path, solution, timeout, progress=None, answers=None, verbose=False, backend="mpi", device=None,
          traces=None):
    """{task key: (passed, message)}. One job per world size grades every task still passing.
    A task that fails there after another task ran in the same job (which might have left it
    a message), or that raised or hung, is graded again alone on that size: the message is
    always the task's own. A task that was stuck past its budget or ended the process keeps the
    verdict of the job it ended (alone, it would only take as long to say the same); the other
    tasks of that job run again together. ``traces``: filled as :func:`run_tasks` says, so each
    task ends with the events of its last job that ran to its end."""
    verdict, alive = {}, list(tasks)
    for n in sorted({n for t in tasks for n in t.sizes}):
        batch = [t for t in alive if n in t.sizes]
        while batch:
            if progress:
                progress(f"  ... {len(batch)} task{'s' if len(batch) > 1 else ''} on {ranks(n)}")
            result, whole = run_tasks(batch, n, path, solution, timeout, answers, verbose, backend, device, traces)
            for i, t in enumerate(batch):
                message = result[t.key]
                if message == AGAIN:
                    continue
                if message == ALONE or (whole and message is not None and i > 0
                                        and not message.startswith("not implemented")):
                    message = run_tasks([t], n, path, solution, timeout, answers, verbose, backend, device,
                                        traces)[0][t.key]
                if message is not None:
                    verdict[t.key] = (False, message)
                    alive.remove(t)
            batch = [t for t in batch if result[t.key] == AGAIN]
    for t in alive:
        verdict[t.key] = (True, f"PASS on {', '.join(map(str, t.sizes))} rank{'s' if t.sizes != (1,) else ''}")
    return verdict


def write_trace(path, traces, tasks):
    """``--trace``: every task's graded calls as one Chrome trace (open in https://ui.perfetto.dev),
    one process per rank; the tasks without a message in it are named."""
    events = sorted((e for evs in traces.values() for e in evs), key=lambda e: (e.t_start, e.rank))
    write_chrome_trace(path, events)
    messages = sum(1 for e in events if e.peer >= 0)
    sent = [t.key for t in tasks if traces.get(t.key)]
    none = [t.key for t in tasks if not traces.get(t.key)]
    print(f"trace: {path}: {messages} messages of the graded calls of "
          + (f"task{'s' if len(sent) > 1 else ''} {', '.join(sent)}" if sent else "no task")
          + ", each from its last graded run that finished (open it in https://ui.perfetto.dev)"
          + (f"; no message of {', '.join(none)} (its graded calls send none, or none of its runs finished)"
             if none else ""), flush=True)


def main(args) -> int:
    try:
        return _main(args)
    except UsageError as err:
        print(f"minipar check: error: {err}", file=sys.stderr)
        return 2


def _main(args) -> int:
    lesson, lab = load_lab(args.lab)
    backend = getattr(args, "backend", None) or lesson.backends[0]
    if backend not in lesson.backends:  # lab 09 (torch's engines) has nothing to grade on MPI
        raise UsageError(f"lab {lesson.key} is graded on {' and '.join(lesson.backends)} only, not on {backend} "
                         f"(drop --backend {backend})")
    tasks = lab.TASKS
    if args.task:
        known = [t.key for t in tasks]
        unknown = [t for t in args.task if t not in known]
        if unknown:
            raise UsageError(f"--task {', '.join(unknown)}: lab {lesson.key} has tasks {', '.join(known)}")
        tasks = [t for t in tasks if t.key in args.task]
    if args.solution:
        path, solution, what = None, lesson.solution, "minipar's reference implementation"
    else:
        path = str(graded_file(lesson, args.file))
        shown = os.path.relpath(path)
        solution, what = None, path if shown.startswith("..") else os.path.join(".", shown)
    on = "NumPy arrays over MPI" if backend == "mpi" else f"torch tensors over torch.distributed ({args.device or 'cpu'})"
    print(f"lab {lesson.key}: {lab.TITLE}\ngrading {what}\non {on}\n", flush=True)
    traces = {} if getattr(args, "trace", None) else None
    verdict = grade(tasks, path, solution, args.timeout, progress=lambda s: print(s, flush=True),
                    answers=lesson.solution, verbose=args.verbose, backend=backend, device=getattr(args, "device", None),
                    traces=traces)
    print()
    for t in tasks:
        ok, msg = verdict[t.key]
        title = t.title + (" (core)" if t.tier == "core" else "")
        print(f"  {t.key} {title:<28} {'PASS' if ok else 'FAIL'}  {msg if not ok else msg[5:]}", flush=True)
    passed = sum(ok for ok, _ in verdict.values())
    print(f"\n{passed}/{len(tasks)} tasks pass")
    if traces is not None:
        write_trace(args.trace, traces, tasks)
    return 0 if passed == len(tasks) else 1
