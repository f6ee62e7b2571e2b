"""Planted bug: the shard index is off by one

Rank r updates its parameter shard r with the gradient shard r+1 (the neighbour's). On one
rank the neighbour is the rank itself and all is well; on two ranks every element is wrong:
the grader hands each rank only its own shard of the averaged gradient (the rest is NaN).

EXPECT_TASK: 4.3
EXPECT_MESSAGE: rank 0: the new parameter is NaN at element 0
EXPECT_MESSAGE: rank 0 computed with data it does not own (it holds only elements 0:5 of the averaged gradient
"""
from minipar.collectives import all_gather
from minipar.labs.lab04_solution import *  # noqa: F401,F403  everything else is right
from minipar.labs.lab04_solution import padded
from minipar.optim import adam_step
from minipar.xp import copy, size


def zero1_update(comm, param, avg_grad, m, v, step, lr):
    p, r = comm.size, comm.rank
    P, G = padded(param, p), padded(avg_grad, p)
    S = size(P) // p
    shard = copy(P[r * S:(r + 1) * S])
    nxt = (r + 1) % p  # BUG: should be r
    adam_step(shard, G[nxt * S:(nxt + 1) * S], m, v, step, lr)
    return all_gather(comm, shard)[:size(param)]
