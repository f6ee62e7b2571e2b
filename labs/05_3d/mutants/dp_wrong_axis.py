"""Planted bug: the DP group built along the wrong axis

The data-parallel group is taken along the TP axis: the ranks that share (dp, pp) instead of
(pp, tp). Training with it averages the shards of *different* columns of each matrix together
(and, on a grid with dp = 1, never averages the replicas at all).

EXPECT_TASK: 5.1
EXPECT_MESSAGE: grid_groups(dp=2, pp=1, tp=2, rank=0)['dp'] = [0, 1], expected [0, 2]
EXPECT_MESSAGE: that is its tp group (the shards of its layers): built along the wrong axis; the dp group holds only the ranks that share rank 0's (pp, tp) coordinates
"""
from minipar.labs.lab05_solution import *  # noqa: F401,F403  everything else is right
from minipar.labs.lab05_solution import grid_groups as right


def grid_groups(dp, pp, tp, rank):
    out = right(dp, pp, tp, rank)
    out["dp"] = out["tp"]  # BUG: the ranks with the same (dp, pp), not the same (pp, tp)
    return out
