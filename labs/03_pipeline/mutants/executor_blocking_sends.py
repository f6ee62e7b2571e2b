"""Planted bug: the executor sends with a blocking send, then receives (a deadlock)

Each action receives what it needs, computes, and sends its result with comm.send, which
returns only once the receiver has begun receiving. In 1F1B's steady state rank r sends the
activation of micro-batch i to rank r + 1 while rank r + 1 sends the gradient of an earlier
micro-batch back to rank r: each waits for the other to receive, and neither gets there. It
deadlocks for every p >= 2 once m >= 2 (a blocking send in one direction only would not); sends
are synchronous on both backends, so it deadlocks every time, and the watchdog names the sends.

EXPECT_TASK: 3.5
EXPECT_MESSAGE: hangs on 2 ranks (deadlock or a send without its recv)
EXPECT_MESSAGE: rank 0: blocked in send to rank 1
EXPECT_MESSAGE: rank 1: blocked in send to rank 0
"""
from minipar.labs.lab03_solution import *  # noqa: F401,F403  everything else is right
from minipar.pipeline.execute import act_tag, grad_tag


def pipeline_step(comm, actions, stage, microbatches, loss):
    m, last = len(microbatches), comm.size - 1
    shape, dtype = tuple(microbatches[0].shape), microbatches[0].dtype
    saved, dys, total = {}, {}, 0.0
    for s, kind, i in actions:
        if kind == "F":
            x = microbatches[i] if s == 0 else comm.recv(comm.empty(shape, dtype), s - 1, act_tag(s, i, m))
            y, saved[i] = stage.forward(x)
            if s == last:
                value, dys[i] = loss(y, i)
                total += value
            else:
                comm.send(y, s + 1, act_tag(s + 1, i, m))  # BUG: waits for rank s + 1 to receive it
        else:
            dy = dys.pop(i) if s == last else comm.recv(comm.empty(shape, dtype), s + 1, grad_tag(s, i, m))
            dx = stage.backward(dy, saved.pop(i))
            if s > 0:
                comm.send(dx, s - 1, grad_tag(s - 1, i, m))  # BUG: and this for rank s - 1
    return total if comm.rank == last else None
