"""What `minipar check` says when a learner's exercise goes wrong in a way no check foresees: it
names the learner's own line (file, line, source) and the rank it happened on, on both backends.

Each test grades one task of an exercise with a planted bug, on 2 ranks (task 3.2 on its only
size, 1 rank), through the grader's own ``grade``:

* an error raised inside ``comm`` (a buffer too small for the message: MPI's ValueError, gloo's
  C++ abort under torch) is shown at the learner's call, with the rank it happened on;
* when several ranks raise, the rank named is the rank whose error is shown;
* a loop that never ends, spending its time in the ``__new__`` Python writes for a namedtuple
  (file ``<string>``), is shown at the learner's line, not at ``<string>:1``;
* a loop that never ends and allocates as it goes is stopped at the grader's memory limit per
  rank (``MEMORY``), at its line, long before its time budget;
* an exercise that never finishes its import is stopped within the task's time budget, at its
  line, without mpiexec's banner.
"""
import dataclasses
import textwrap
import time

import pytest

from minipar.labs.grader import MEMORY, TORCH_BUDGET, grade, load_lab

BACKENDS = [pytest.param("mpi", marks=pytest.mark.mpi),
            pytest.param("torch", marks=[pytest.mark.mpi, pytest.mark.torch])]


def graded(tmp_path, lab, key, source, backend, n=2, budget=None):
    """(the exercise's path, its report) for ``source`` graded on task ``key`` alone on ``n`` ranks
    (with the task's time budget, or ``budget`` seconds); the task must fail."""
    if backend == "torch":
        pytest.importorskip("torch")
    lesson, module = load_lab(lab)
    task = next(t for t in module.TASKS if t.key == key)
    task = dataclasses.replace(task, sizes=(n,), budget=budget or task.budget)
    path = tmp_path / "exercise.py"
    path.write_text(textwrap.dedent(source))
    ok, report = grade([task], str(path), None, 20, answers=lesson.solution, backend=backend)[key]
    assert not ok, report
    return path, report


def line_of(path, text):
    """The number of the line of ``path`` that holds ``text``."""
    return next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if text in ln)


RING_PASS = """\
    from minipar.xp import empty


    def ring_pass(comm, x):
        n = x.shape[0] - 1 if comm.rank == 1 else x.shape[0]  # rank 1's buffer is one element short
        buf = empty((n,), like=x)
        return comm.sendrecv(x, (comm.rank + 1) % comm.size, buf, (comm.rank - 1) % comm.size)
    """


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_error_inside_comm_is_shown_at_the_learners_line_on_its_rank(tmp_path, backend):
    """It used to show only minipar's frames (watchdog.py, mpi.py); under torch, gloo aborted the
    process in a thread of its own and the report said "exited ... no exception was raised"."""
    path, report = graded(tmp_path, "01", "1.1", RING_PASS, backend)
    head = report.splitlines()[0]
    assert head.endswith("on 2 ranks (rank 1):") and head.startswith("raised" if backend == "mpi" else "crashed"), report
    assert f'File "{path}", line {line_of(path, "comm.sendrecv")}, in ring_pass' in report, report
    assert "return comm.sendrecv(x, (comm.rank + 1) % comm.size, buf, (comm.rank - 1) % comm.size)" in report, report
    assert "sendrecv: the message" in report and "is larger than buf" in report, report


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_rank_named_is_the_rank_whose_error_is_shown(tmp_path, backend):
    """Both ranks raise, each its own error (the neighbours without ``% comm.size``: rank 0's left
    is -1, rank 1's right is 2). The report named the first rank anywhere in the output and showed
    the last lines printed, often the other rank's error."""
    path, report = graded(tmp_path, "01", "1.1", """\
        from minipar.xp import empty


        def ring_pass(comm, x):
            buf = empty(x.shape, like=x)
            return comm.sendrecv(x, comm.rank + 1, buf, comm.rank - 1)
        """, backend)
    rank = int(report.splitlines()[0].rpartition("(rank ")[2].split(")")[0])
    assert ("src=-1 is not a rank" if rank == 0 else "dst=2 is not a rank") in report, report
    assert ("dst=2" if rank == 0 else "src=-1") not in report, report
    assert f'File "{path}", line {line_of(path, "comm.sendrecv")}, in ring_pass' in report, report


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_loop_that_never_ends_is_shown_at_the_learners_line_not_in_generated_code(tmp_path, backend):
    """A schedule built from ``count()`` (no stop at m): every Python frame the loop enters is the
    namedtuple's ``__new__``, whose file is ``<string>``; the report said "at <string>:1"."""
    path, report = graded(tmp_path, "03", "3.2", """\
        from itertools import count, repeat
        from typing import NamedTuple


        class Action(NamedTuple):
            stage: int
            kind: str
            microbatch: int


        def one_f_one_b(p, m):
            return [list(map(Action, repeat(r), repeat("F"), count())) for r in range(p)]  # never stops at m
        """, backend, n=1, budget=3)
    took = 3 * (TORCH_BUDGET if backend == "torch" else 1)  # a budget is longer on torch (grader.budget)
    assert report.startswith(f"task 3.2 did not finish in {took:g} s on 1 rank (a loop that never ends, or a sleep?): "
                             f"rank 0 was running Python, not communicating, at {path}:{line_of(path, 'count()')}: "
                             "return [list(map(Action"), report
    assert "<string>" not in report, report


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_loop_that_allocates_is_stopped_at_its_memory_limit_at_its_line(tmp_path, backend):
    """Only rank 1 runs away, about half a gigabyte a second: within its time budget it would take
    gigabytes (the test's exercise stops by itself at 1.6 GB, whatever the grader does). The
    watchdog stops it past ``MEMORY`` megabytes of growth, and then holds it where it is."""
    t0 = time.monotonic()
    path, report = graded(tmp_path, "01", "1.1", """\
        from minipar.xp import empty


        def ring_pass(comm, x):
            buf = empty(x.shape, like=x)
            got = comm.sendrecv(x, (comm.rank + 1) % comm.size, buf, (comm.rank - 1) % comm.size)
            seen, step = [], 0
            while comm.rank == 1 and step < comm.size and len(seen) < 2000:  # step never grows (2000: the test's cap)
                seen.append([got] * 100_000)
            return got
        """, backend, budget=30)
    took = time.monotonic() - t0
    head = report.splitlines()[0]
    assert head.startswith("task 1.1 ran out of its memory on 2 ranks: rank 1 used "), report
    assert f"MB more than when it began (the limit: {MEMORY} MB more" in head, report
    grew = int(head.split(" MB more than")[0].rpartition(" ")[2])
    assert MEMORY < grew < MEMORY + 1024, report
    assert head.endswith(f", at {path}:{line_of(path, 'seen.append')}: seen.append([got] * 100_000)"), report
    assert "rank 0: " in report and took < 60, f"{took:.0f} s\n{report}"


@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["mpi"])  # the import runs the same way on torch's ranks
def test_an_exercise_that_hangs_at_import_is_stopped_within_the_budget_at_its_line(tmp_path, backend):
    """It used to wait out the job's hard limit (96 s for one task, 186 s for a lab, in silence),
    then show the tail of mpiexec's banner."""
    t0 = time.monotonic()
    path, report = graded(tmp_path, "01", "1.1", """\
        import time

        from minipar.xp import empty

        time.sleep(10**6)


        def ring_pass(comm, x):
            buf = empty(x.shape, like=x)
            return comm.sendrecv(x, (comm.rank + 1) % comm.size, buf, (comm.rank - 1) % comm.size)
        """, backend, budget=3)
    took = time.monotonic() - t0
    assert report.startswith("the exercise's import did not finish in 3 s on 2 ranks (a loop that never ends, or "
                             f"a sleep?): rank 0 was running Python, not communicating, at {path}:5: time.sleep(10**6)"), report
    assert "=====" not in report and "BAD TERMINATION" not in report, report
    assert took < 3 + 30, f"{took:.0f} s\n{report}"
