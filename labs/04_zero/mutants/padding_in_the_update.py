"""Planted bug: the padding is not zeros, so it enters the update

Padding by repeating the vector from its start (what np.resize does), so the padding holds real
gradient values: Adam updates the padding elements and their m and v. The returned parameter is still
right (the padding is cut off at the end), but the optimizer state is not, and with weight
decay or a later re-layout the garbage would leak. Only the ranks that own padding see it.

EXPECT_TASK: 4.3
EXPECT_MESSAGE: rank 1: Adam's m or v is nonzero on the padding (elements 7..7 of the padded vector, past n=7)
"""
from minipar.collectives import all_gather
from minipar.labs.lab04_solution import *  # noqa: F401,F403  everything else is right
from minipar.optim import adam_step
from minipar.xp import copy, namespace, size


def repeated(x, n):
    """x repeated from its start to n elements (np.resize)."""
    return namespace(x).concat([x] * -(-n // size(x)))[:n]


def zero1_update(comm, param, avg_grad, m, v, step, lr):
    p, r = comm.size, comm.rank
    n_pad = -(-size(param) // p) * p
    P, G = repeated(param, n_pad), repeated(avg_grad, n_pad)  # BUG: repeats, does not zero
    S = n_pad // p
    shard = copy(P[r * S:(r + 1) * S])
    adam_step(shard, G[r * S:(r + 1) * S], m, v, step, lr)
    return all_gather(comm, shard)[:size(param)]
