"""Lab 03's reference: minipar's own pipeline pieces under the names the exercise uses."""
from ..pipeline import schedules as S
from ..pipeline.execute import act_tag, grad_tag


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


def peer_and_tag(action, schedule):
    s, kind, i = action
    last, m, owner = schedule.total_stages - 1, schedule.microbatches, schedule.stage_to_rank
    if kind == "F":
        recv = (owner[s - 1], act_tag(s, i, m)) if s > 0 else None
        send = (owner[s + 1], act_tag(s + 1, i, m)) if s < last else None
    elif kind in "BI":
        recv = (owner[s + 1], grad_tag(s, i, m)) if s < last else None
        send = (owner[s - 1], grad_tag(s - 1, i, m)) if s > 0 else None
    else:  # W: weight gradient, stays on this rank
        recv = send = None
    return recv, send
