"""Planted bug: the executor runs every forward of its actions first, then every backward

The messages are 1F1B's, the loss and the gradients are right, and it cannot deadlock (GPipe's
order is a valid schedule too). But a rank now holds the activations of all m micro-batches
before the first backward frees any: GPipe's memory, not 1F1B's bound of min(p - r, m) (on one
rank already: 1F1B there is F0 B0 F1 B1 ..., one micro-batch at a time). The grader counts the
forward contexts in flight.

EXPECT_TASK: 3.5
EXPECT_MESSAGE: rank 0 held 25344 bytes at once inside pipeline_step; 1F1B runs each backward where its actions put it, so stage 0 holds the activations of min(p - s, m) = 1 micro-batch at most (1F1B p=1 m=3): at most 8448
EXPECT_MESSAGE: the forward context of micro-batch 2
"""
from minipar.labs.lab03_solution import *  # noqa: F401,F403  everything else is right
from minipar.pipeline.execute import act_tag, grad_tag


def pipeline_step(comm, actions, stage, microbatches, loss):
    m, last = len(microbatches), comm.size - 1
    shape, dtype = tuple(microbatches[0].shape), microbatches[0].dtype
    saved, dys, pending, total = {}, {}, [], 0.0
    ordered = [a for a in actions if a[1] == "F"] + [a for a in actions if a[1] == "B"]  # BUG: GPipe's order
    for s, kind, i in ordered:
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
                pending.append(comm.isend(dx, s - 1, grad_tag(s - 1, i, m)))
        pending = [req for req in pending if not req.test()]
    for req in pending:
        req.wait()
    return total if comm.rank == last else None
