"""Planted bug: DP gradients averaged inside every micro-batch

The replicas average after every micro-batch's backward (what DistributedDataParallel does
without ``no_sync()`` under gradient accumulation), and once more after the flush. Averaging is
linear, so the gradients come out right; the traffic is m + 1 times one step's, and each
average sits on the critical path of the pipeline.

EXPECT_TASK: 5.4
EXPECT_MESSAGE: rank 0 sent 87168 bytes over grid.dp, 3 times one step's average (29056) (dp2 pp1 tp1 (1f1b, m=2))
"""
from minipar.collectives import all_reduce
from minipar.labs.lab05_solution import *  # noqa: F401,F403  everything else is right
from minipar.labs.lab05_solution import sync_tied


def train_step(grid, pipeline, grads, tied):
    def average(g):
        g[...] = all_reduce(grid.dp, g) / grid.dp.size

    for g in grads:
        g[...] = 0
    pipeline(after_action=lambda action, held: [average(g) for g in grads] if action.kind in "BW" else None)  # BUG
    if tied is not None:
        tied[...] = sync_tied(grid.pp, tied)
    for g in grads:
        average(g)
