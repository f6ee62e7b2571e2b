"""Planted bug: the tied embedding counted on the first and on the last stage

With pp > 1 the embedding (first stage) and the head (last stage) each hold a copy of wte, with
the same summed gradient (5.3). Counting both adds its squares twice.

EXPECT_TASK: 5.6
EXPECT_MESSAGE: expected
EXPECT_MESSAGE: the tied embedding counted on the first and on the last stage
"""
import math

from minipar.collectives import all_reduce
from minipar.labs.lab05_solution import *  # noqa: F401,F403  everything else is right
from minipar.xp import zeros


def global_grad_norm(grid, grads):
    d, p, t = grid.coords
    mine = zeros((1,), like=grads[0][1])
    for name, g, split, (lo, hi) in grads:  # BUG: the last stage's copy of wte is not skipped
        if split or t == 0:
            mine += (g[lo:hi] ** 2).sum()
    return math.sqrt(float(all_reduce(grid.world, mine)[0]))
