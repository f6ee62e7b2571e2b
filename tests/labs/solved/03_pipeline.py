"""Lab 03 solved as a learner would, in the skeleton's style (its own Action and tag helpers,
nothing from minipar.pipeline). Must pass `minipar check 03 --file`."""
from typing import NamedTuple


class Action(NamedTuple):
    stage: int
    kind: str
    microbatch: int


def act_tag(stage, microbatch, m):
    return 2 * (stage * m + microbatch)


def grad_tag(stage, microbatch, m):
    return 2 * (stage * m + microbatch) + 1


def gpipe(p, m):
    return [[Action(r, "F", i) for i in range(m)] + [Action(r, "B", i) for i in range(m)] for r in range(p)]


def one_f_one_b(p, m):
    out = []
    for r in range(p):
        warm = min(p - 1 - r, m)
        ops = [Action(r, "F", i) for i in range(warm)]
        for i in range(warm, m):
            ops += [Action(r, "F", i), Action(r, "B", i - warm)]
        ops += [Action(r, "B", i) for i in range(m - warm, m)]
        out.append(ops)
    return out


def bubble_fraction(events, p):
    start = min(s for _, s, _ in events)
    span = max(e for _, _, e in events) - start
    busy = sum(e - s for _, s, e in events)
    return (p * span - busy) / (p * span)


def peer_and_tag(action, schedule):
    s, kind, i = action
    m, last, owner = schedule.microbatches, schedule.total_stages - 1, schedule.stage_to_rank
    if kind == "F":
        return ((owner[s - 1], act_tag(s, i, m)) if s > 0 else None,
                (owner[s + 1], act_tag(s + 1, i, m)) if s < last else None)
    if kind in ("B", "I"):
        return ((owner[s + 1], grad_tag(s, i, m)) if s < last else None,
                (owner[s - 1], grad_tag(s - 1, i, m)) if s > 0 else None)
    return None, None


def pipeline_step(comm, actions, stage, microbatches, loss):
    m, last, me = len(microbatches), comm.size - 1, comm.rank
    shape, dtype = tuple(microbatches[0].shape), microbatches[0].dtype
    saved, dys, pending, total = {}, {}, [], 0.0
    for s, kind, i in actions:
        if kind == "F":
            x = microbatches[i] if s == 0 else comm.recv(comm.empty(shape, dtype), s - 1, act_tag(s, i, m))
            y, saved[i] = stage.forward(x)
            if s == last:
                value, dys[i] = loss(y, i)
                total += value
            else:
                pending.append(comm.isend(y, s + 1, act_tag(s + 1, i, m)))  # never waits: no deadlock
        else:
            dy = dys.pop(i) if s == last else comm.recv(comm.empty(shape, dtype), s + 1, grad_tag(s, i, m))
            dx = stage.backward(dy, saved.pop(i))  # the micro-batch's activations go here
            if s > 0:
                pending.append(comm.isend(dx, s - 1, grad_tag(s - 1, i, m)))
        x = y = dy = dx = None
        pending = [req for req in pending if not req.test()]  # a completed send frees its array
    for req in pending:
        req.wait()
    return total if me == last else None
