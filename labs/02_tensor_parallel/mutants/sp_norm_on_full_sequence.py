"""Planted bug: sequence parallelism with the LayerNorm on the full sequence

The all-gather comes first and the LayerNorm runs on all T tokens, as in the tensor-parallel block
without sequence parallelism. The values are right and the bytes are the same, but every rank
normalises (and would keep for its backward) all T tokens instead of its own T/p: the memory
sequence parallelism exists to save. The grader's norm counts the token rows it is given.

EXPECT_TASK: 2.7
EXPECT_MESSAGE: rank 0: the LayerNorm ran on 24 token rows (norm was called on [24] rows)
EXPECT_MESSAGE: run norm before the all-gather
"""
from minipar.collectives import all_gather, reduce_scatter
from minipar.labs.lab02_solution import *  # noqa: F401,F403  everything else is right
from minipar.nn.functional import gelu_forward
from minipar.xp import chunk_bounds, contiguous, namespace


def _tokens_first(a):
    return contiguous(namespace(a).permute_dims(a, (1, 0, 2)))


def sequence_parallel_mlp(comm, x, norm, w1, b1, w2, b2):
    t_lo, t_hi = chunk_bounds(x.shape[1], comm.size)[comm.rank]
    lo, hi = chunk_bounds(w1.shape[1], comm.size)[comm.rank]
    mine = x[:, t_lo:t_hi]
    h = norm(_tokens_first(all_gather(comm, _tokens_first(mine))))  # BUG: the LayerNorm on all T tokens
    partial = gelu_forward(h @ w1[:, lo:hi] + b1[lo:hi])[0] @ w2[lo:hi]
    return _tokens_first(reduce_scatter(comm, _tokens_first(partial))) + b2 + mine
