"""Planted bug: the sum over the pipeline missing

The squares are added over the TP and the dp groups (grid.tp, grid.dp) but not over grid.pp: each
stage clips by the norm of its own layers, a different factor on every stage.

EXPECT_TASK: 5.6
EXPECT_MESSAGE: expected
EXPECT_MESSAGE: the sum over the pipeline is missing
"""
import math

from minipar.collectives import all_reduce
from minipar.labs.lab05_solution import *  # noqa: F401,F403  everything else is right
from minipar.xp import zeros


def global_grad_norm(grid, grads):
    d, p, t = grid.coords
    mine = zeros((1,), like=grads[0][1])
    for name, g, split, (lo, hi) in grads:
        if (split or t == 0) and not (name == "wte" and p == grid.pp.size - 1 and p > 0):
            mine += (g[lo:hi] ** 2).sum()
    s = all_reduce(grid.dp, all_reduce(grid.tp, mine))  # BUG: no all_reduce over grid.pp
    return math.sqrt(float(s[0]))
