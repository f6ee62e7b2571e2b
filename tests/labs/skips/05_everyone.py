"""Skips the technique by putting everyone in: a DP group of every rank, the full logits on
every rank (the dense softmax over the whole array it was handed), the tied gradient summed over
the whole pipeline (the stages in between add zeros, after learning the shape), the DP average
over the whole world.

EXPECT 5.1: grid_groups(dp=2, pp=1, tp=2, rank=0)['dp'] = [0, 1, 2, 3], expected [0, 2]
EXPECT 5.1: that is every rank of the grid; the dp group holds only the ranks that share rank 0's (pp, tp) coordinates
EXPECT 5.2: rank 0: the loss is NaN at element 0 (1 of 1 elements NaN): rank 0 computed with data it does not own (it holds only columns 0:12 of the logits
EXPECT 5.3: rank 0 sent 784 bytes through comm; the sum of the tied gradient over the first and the last stage, (12, 8) doubles (shape (12, 8), pipeline of 2 stages) on 2 ranks sends exactly 768
EXPECT 5.4: besides the pipeline's messages and the DP average over grid.dp
EXPECT 5.4: world:
"""
import numpy as np

from minipar.collectives import all_reduce
from minipar.nn.functional import cross_entropy
from minipar.xp import chunk_bounds


def grid_groups(dp, pp, tp, rank):
    ranks = np.arange(dp * pp * tp).reshape(dp, pp, tp)
    d, p, t = np.argwhere(ranks == rank)[0]
    emb = [int(ranks[d, 0, t]), int(ranks[d, -1, t])] if pp > 1 and p in (0, pp - 1) else None
    return {"tp": ranks[d, p, :].tolist(), "pp": ranks[d, :, t].tolist(), "dp": list(range(dp * pp * tp)), "emb": emb}


def vocab_parallel_cross_entropy(comm, logits, labels):
    lo, hi = chunk_bounds(logits.shape[-1], comm.size)[comm.rank]
    loss, dlogits = cross_entropy(logits, labels)  # everything, then my columns
    return loss, dlogits[..., lo:hi]


def sync_tied(pp, grad):
    if pp.size == 1:
        return grad
    shape = pp.asarray(np.array(grad.shape if grad is not None else (0, 0), dtype=np.float64))
    dims = all_reduce(pp, shape, op="max")
    total = all_reduce(pp, grad if grad is not None else pp.asarray(np.zeros(tuple(int(n) for n in dims))))
    return total if grad is not None else None


def train_step(grid, pipeline, grads, tied):
    for g in grads:
        g[...] = 0
    pipeline()
    if grid.emb is not None:
        tied[...] = all_reduce(grid.emb, tied)
    for g in grads:
        g[...] = all_reduce(grid.world, g) / grid.world.size
