"""Planted bug: each ring step waits for the transfer before computing

The values are right and so is every byte, but the rank first waits for the next K/V block
and only then attends to the block it holds: communication and compute take turns instead of
overlapping. The grader sees it in the trace: no irecv is open while attend runs.

EXPECT_TASK: 6.2
EXPECT_MESSAGE: rank 0 attended to block 0 (step 0) with no transfer in flight
EXPECT_MESSAGE: post the step's irecv and isend, attend to the block you hold, then wait
"""
from minipar.labs.lab06_solution import *  # noqa: F401,F403  everything else is right
from minipar.xp import empty, namespace


def ring_attention(comm, q, k, v, attend, causal):
    p, r, t, xp = comm.size, comm.rank, q.shape[-2], namespace(q)
    kv, state = xp.stack([k, v]), None
    for s in range(p):
        held = kv
        if s < p - 1:
            kv = empty(held.shape, like=held)
            reqs = [comm.irecv(kv, (r - 1) % p), comm.isend(held, (r + 1) % p)]
            for req in reqs:  # BUG: waits here, before the compute
                req.wait()
        j = (r - s) % p
        if not (causal and j > r):
            part = attend(q, held[0], held[1], xp.tril(xp.ones((t, t), dtype=xp.bool)) if causal and j == r else None)
            state = part if state is None else merge(state, part)  # noqa: F405
    acc, _, l = state
    return acc / l
