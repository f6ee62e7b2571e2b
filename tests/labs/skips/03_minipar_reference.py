"""Skips the technique by running minipar's own answers, reached where a rule on import names
does not look: the schedule generators through a module alias (``schedules as S``), the bubble
through the lab's solution module and the pairing through the executor's module, both imported
inside the function (and the executor too). The grader sees what the call executes, however it
got there.

EXPECT 3.1: gpipe ran minipar's own minipar.pipeline.schedules.gpipe (called at tests/labs/skips/03_minipar_reference.py:17: return S.gpipe(p, m).actions): write gpipe yourself
EXPECT 3.2: one_f_one_b ran minipar's own minipar.pipeline.schedules.one_f_one_b
EXPECT 3.3: bubble_fraction ran minipar's own minipar.labs.lab03_solution.bubble_fraction (called at tests/labs/skips/03_minipar_reference.py:27
EXPECT 3.4: peer_and_tag ran minipar's own minipar.pipeline.execute.peer_and_tag
EXPECT 3.5: pipeline_step ran minipar's own minipar.pipeline.execute.run_schedule (called at tests/labs/skips/03_minipar_reference.py:41
"""
from minipar.pipeline import schedules as S


def gpipe(p, m):
    return S.gpipe(p, m).actions


def one_f_one_b(p, m):
    return S.one_f_one_b(p, m).actions


def bubble_fraction(events, p):
    from minipar.labs import lab03_solution

    return lab03_solution.bubble_fraction(events, p)


def peer_and_tag(action, schedule):
    from minipar.pipeline import execute

    return execute.peer_and_tag(action, schedule)


def pipeline_step(comm, actions, stage, microbatches, loss):
    from minipar.pipeline import Schedule, execute

    rows = [list(actions) if r == comm.rank else [] for r in range(comm.size)]
    sched = Schedule("1f1b", comm.size, len(microbatches), 1, rows)
    return execute.run_schedule(comm, sched, {comm.rank: stage}, microbatches, list(range(len(microbatches))),
                                loss=loss, scale=1.0, check=False)["loss"]
