"""Planted bug: the executor sends each input gradient to the next rank around the ring

The gradient of stage s goes back to stage s - 1; this sends it to rank (s + 1) % p, like an
activation. On 2 ranks the two neighbours are the same rank and the bug hides; on 3 ranks the
grader sees the send posted to the wrong rank and refuses it there, before anyone waits for it.

EXPECT_TASK: 3.5
EXPECT_MESSAGE: raised an exception on 3 ranks
EXPECT_MESSAGE: UnexpectedMessage: rank
EXPECT_MESSAGE: posted a send to rank
EXPECT_MESSAGE: that tag is the gradient coming back into stage
"""
from minipar.labs.lab03_solution import *  # noqa: F401,F403  everything else is right
from minipar.pipeline.execute import act_tag, grad_tag


def pipeline_step(comm, actions, stage, microbatches, loss):
    m, p, last = len(microbatches), comm.size, comm.size - 1
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
                pending.append(comm.isend(y, s + 1, act_tag(s + 1, i, m)))
        else:
            dy = dys.pop(i) if s == last else comm.recv(comm.empty(shape, dtype), s + 1, grad_tag(s, i, m))
            dx = stage.backward(dy, saved.pop(i))
            if s > 0:
                pending.append(comm.isend(dx, (s + 1) % p, grad_tag(s - 1, i, m)))  # BUG: s - 1, not s + 1
        pending = [req for req in pending if not req.test()]
    for req in pending:
        req.wait()
    return total if comm.rank == last else None
