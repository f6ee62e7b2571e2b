"""Planted bug: the tied embedding counted on the first and on the last stage

With pp > 1 the embedding (first stage) and the head (last stage) each hold a copy of wte, with
the same summed gradient (5.3). Counting both adds its squares twice.

EXPECT_TASK: 5.6
EXPECT_MESSAGE: expected
EXPECT_MESSAGE: the tied embedding counted on the first and on the last stage
"""
import math

import numpy as np

from minipar.collectives import all_reduce
from minipar.labs.lab05_solution import *  # noqa: F401,F403  everything else is right


def global_grad_norm(grid, grads):
    d, p, t = grid.coords
    mine = 0.0
    for name, g, split, (lo, hi) in grads:  # BUG: the last stage's copy of wte is not skipped
        if split or t == 0:
            mine += float(np.sum(g[lo:hi] ** 2))
    return math.sqrt(float(all_reduce(grid.world, np.array([mine]))[0]))
