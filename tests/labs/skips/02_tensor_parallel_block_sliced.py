"""Skips sequence parallelism: the tensor-parallel block as it was (f and g), then sliced. Every
rank gathers the normalised tokens, runs the block on all T of them, all-reduces fc2's partial
sums whole and keeps its own tokens of the result. The values are right, but the block sends the
all-gather *and* the all-reduce: 1.5 times the bytes of sequence parallelism, which replaces the
all-reduce by a reduce-scatter.

EXPECT 2.7: rank 0 sent 3456 bytes through comm; sequence parallelism (an all-gather and a reduce-scatter of the (2, 12, 12) activations along the tokens: the bytes of one ring all-reduce) on 2 ranks sends exactly 2304
EXPECT 2.7: gathering x and all-reducing the output (the f/g block, sliced afterwards) sends 1.5 times that
"""
from minipar.collectives import all_gather, all_reduce
from minipar.nn.functional import gelu_forward
from minipar.xp import chunk_bounds, contiguous, namespace


def _tokens_first(a):
    return contiguous(namespace(a).permute_dims(a, (1, 0, 2)))


def sequence_parallel_mlp(comm, x, norm, w1, b1, w2, b2):
    t_lo, t_hi = chunk_bounds(x.shape[1], comm.size)[comm.rank]
    lo, hi = chunk_bounds(w1.shape[1], comm.size)[comm.rank]
    mine = x[:, t_lo:t_hi]
    h = _tokens_first(all_gather(comm, _tokens_first(norm(mine))))
    y = all_reduce(comm, gelu_forward(h @ w1[:, lo:hi] + b1[lo:hi])[0] @ w2[lo:hi]) + b2  # (B, T, C) whole
    return y[:, t_lo:t_hi] + mine
