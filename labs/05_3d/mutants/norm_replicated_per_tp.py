"""Planted bug: the parameters held whole on every TP rank counted on each of them

LayerNorms, row-parallel biases and wpe are replicated over tp: every TP rank holds the same
gradient. Adding each rank's squares counts them tp times (Megatron counts them on TP rank 0
only, or divides by tp); the norm is too large and clipping too strong.

EXPECT_TASK: 5.6
EXPECT_MESSAGE: expected
EXPECT_MESSAGE: counted on each of them
"""
import math

from minipar.collectives import all_reduce
from minipar.labs.lab05_solution import *  # noqa: F401,F403  everything else is right
from minipar.xp import zeros


def global_grad_norm(grid, grads):
    d, p, t = grid.coords
    mine = zeros((1,), like=grads[0][1])
    for name, g, split, (lo, hi) in grads:  # BUG: no `split or t == 0`
        if not (name == "wte" and p == grid.pp.size - 1 and p > 0):
            mine += (g[lo:hi] ** 2).sum()
    return math.sqrt(float(all_reduce(grid.world, mine)[0]))
