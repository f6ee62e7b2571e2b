"""Skips the technique: gathers where it should reduce. The row split all-gathers the partial
sums and adds them up locally (p-1 whole partial sums per rank on more than 2 ranks, and one
message instead of the ring's two on 2); the column backward gathers dY to compute the whole
dx locally, with columns of w it does not own.

EXPECT 2.2: rank 0 sent 1 messages; one ring all-reduce of the (5, 12) partial sums X_r @ A_r on 2 ranks sends exactly 2 (the trace shows all_gather:ring x1)
EXPECT 2.3: rank 0: dx (the whole input gradient) is NaN at element 0 (60 of 60 elements NaN): rank 0 computed with data it does not own (it holds only columns 0:12 of w and of dY
EXPECT 2.5: rank 0 sent 1 messages; one ring all-reduce of the (5, 12) output
"""
from minipar.collectives import all_gather
from minipar.nn.functional import gelu_forward
from minipar.xp import chunk_bounds, contiguous


def _mine(comm, n):
    return chunk_bounds(n, comm.size)[comm.rank]


def _gathered_sum(comm, partial):
    return all_gather(comm, partial).reshape((comm.size,) + partial.shape).sum(axis=0)


def row_forward(comm, x, w, b):
    lo, hi = _mine(comm, w.shape[0])
    return _gathered_sum(comm, x[:, lo:hi] @ w[lo:hi]) + b


def column_backward(comm, dy_r, x, w):
    dy = contiguous(all_gather(comm, contiguous(dy_r.T)).T)  # every rank's columns of dY
    return dy @ w.T, x.T @ dy_r, dy_r.sum(axis=0)


def megatron_mlp(comm, x, w1, b1, w2, b2):
    lo, hi = _mine(comm, w1.shape[1])
    return _gathered_sum(comm, gelu_forward(x @ w1[:, lo:hi] + b1[lo:hi])[0] @ w2[lo:hi]) + b2
