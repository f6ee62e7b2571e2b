"""Planted bug: the gradients are not zeroed before the step

The pipeline accumulates every micro-batch's gradient into the arrays, on top of whatever they
held: the previous step's gradients leak into this step.

EXPECT_TASK: 5.4
EXPECT_MESSAGE: still holds what was in it before the step
EXPECT_MESSAGE: zero the gradients before the pipeline runs
"""
from minipar.collectives import all_reduce
from minipar.labs.lab05_solution import *  # noqa: F401,F403  everything else is right
from minipar.labs.lab05_solution import sync_tied


def train_step(grid, pipeline, grads, tied):
    pipeline()  # BUG: no zeroing first
    if tied is not None:
        tied[...] = sync_tied(grid.pp, tied)
    for g in grads:
        g[...] = all_reduce(grid.dp, g) / grid.dp.size
