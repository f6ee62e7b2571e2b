"""Lab 03's reference: minipar's own pipeline pieces under the names the exercise uses."""
from ..pipeline import schedules as S
from ..pipeline.execute import peer_and_tag  # noqa: F401  the executor's convention is the answer to 3.4
from ..pipeline.execute import run_schedule
from ..pipeline.schedules import Schedule


def gpipe(p, m):
    return S.gpipe(p, m).actions


def one_f_one_b(p, m):
    return S.one_f_one_b(p, m).actions


def bubble_fraction(events, p):
    """idle / (p * makespan) from (rank, start, end) events (minipar.pipeline.simulate's rule,
    with the makespan measured from the first start, as minipar.pipeline.execute.measured_bubble)."""
    if not events:
        return 0
    t0 = min(start for _, start, _ in events)
    t1 = max(end for _, _, end in events)
    busy = sum(end - start for _, start, end in events)
    span = t1 - t0
    return (p * span - busy) / (p * span) if span else 0


def pipeline_step(comm, actions, stage, microbatches, loss):
    """minipar's executor runs this rank's actions (isend for every send, a blocking recv where an
    action needs its input): only the rank's own row of the schedule is read, so the others stay
    empty and the schedule is not validated here (the grader hands 1F1B's, valid)."""
    p, m = comm.size, len(microbatches)
    rows = [list(actions) if r == comm.rank else [] for r in range(p)]
    sched = Schedule("1f1b, this rank's actions", p, m, 1, rows)
    out = run_schedule(comm, sched, {comm.rank: stage}, microbatches, list(range(m)), loss=loss, scale=1.0,
                       check=False)  # loss(y, i): micro-batch i's share of the batch loss, already scaled
    return out["loss"]
