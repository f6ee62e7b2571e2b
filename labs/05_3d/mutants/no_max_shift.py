"""Planted bug: a softmax with no shift at all

exp(z) straight away: right for small logits, inf (and then NaN) once a logit passes ~709 in
float64 or ~88 in float32. Subtracting the all-reduced max keeps every exponent <= 0.

EXPECT_TASK: 5.2
EXPECT_MESSAGE: exp overflowed (above ~709 in float64, ~88 in float32): subtract the row's max
"""
import numpy as np

from minipar.collectives import all_reduce
from minipar.labs.lab05_solution import *  # noqa: F401,F403  everything else is right
from minipar.xp import chunk_bounds


def vocab_parallel_cross_entropy(comm, logits, labels):
    lo, hi = chunk_bounds(logits.shape[-1], comm.size)[comm.rank]
    z = logits[..., lo:hi]
    all_reduce(comm, z.max(axis=-1), op="max")  # the max all-reduced, then
    e = np.exp(z)  # BUG: ... not subtracted
    onehot = (labels[..., None] == np.arange(lo, hi)).astype(z.dtype)
    s, zl = all_reduce(comm, np.stack([e.sum(-1), (z * onehot).sum(-1)]))
    n = labels.size
    return np.sum(np.log(s) - zl) / n, (e / s[..., None] - onehot) / n
