"""Planted bug: Ulysses reshapes what the all-to-all returns without moving the source axis

The all-to-all returns (p, B, h, t, hs): row i holds rank i's positions of my heads. Reshaping
that straight to (B, h, T, hs) reads the source-rank axis as if it were the batch and heads:
the sequence is cut along the wrong axis, and every head gets other heads' positions.

EXPECT_TASK: 6.3
EXPECT_MESSAGE: rank 0: attend's q[0, 0, 2, 0] (batch 0, head 0, position 2) holds q's batch 0, head 1, position 0
EXPECT_MESSAGE: must hold heads 0:3 of every position, in position order
"""
from minipar.collectives import all_to_all
from minipar.labs.lab06_solution import *  # noqa: F401,F403  everything else is right
from minipar.xp import contiguous, namespace


def ulysses_attention(comm, q, k, v, attend, causal):
    p = comm.size
    B, nh, t, hs = q.shape
    h, T, xp = nh // p, p * t, namespace(q)
    got = [all_to_all(comm, contiguous(xp.permute_dims(xp.reshape(a, (B, p, h, t, hs)), (1, 0, 2, 3, 4))))
           for a in (q, k, v)]  # each (p, B, h, t, hs)
    qh, kh, vh = (xp.reshape(a, (B, h, T, hs)) for a in got)  # BUG: the source axis p is not moved next to t
    acc, _, l = attend(qh, kh, vh, xp.tril(xp.ones((T, T), dtype=xp.bool)) if causal else None)
    out = xp.permute_dims(xp.reshape(acc / l, (B, h, p, t, hs)), (2, 0, 1, 3, 4))
    back = all_to_all(comm, contiguous(out))
    return xp.reshape(xp.permute_dims(back, (1, 0, 2, 3, 4)), (B, nh, t, hs))
