"""Planted bug: the DP average divides by the whole grid's size

The sum over grid.dp is divided by dp * pp * tp, the world, instead of by dp: as if every rank
held a copy of the gradient. Right on a grid of data parallelism alone; on any grid with a
pipeline or tensor parallelism every gradient comes out pp * tp times too small (on 2 ranks:
dp1 pp1 tp2 halves them).

EXPECT_TASK: 5.4
EXPECT_MESSAGE: rank 0: every gradient is 0.5 times the gradient of the global batch (dp1 pp1 tp2 (1f1b, m=1)): the sum over grid.dp was divided by 2
EXPECT_MESSAGE: the average over the replicas divides it by grid.dp.size = 1 once
"""
from minipar.collectives import all_reduce
from minipar.labs.lab05_solution import *  # noqa: F401,F403  everything else is right
from minipar.labs.lab05_solution import sync_tied


def train_step(grid, pipeline, grads, tied):
    for g in grads:
        g[...] = 0
    pipeline()
    if tied is not None:
        tied[...] = sync_tied(grid.pp, tied)
    n = grid.dp.size * grid.pp.size * grid.tp.size  # BUG: the replicas are grid.dp only
    for g in grads:
        g[...] = all_reduce(grid.dp, g) / n
