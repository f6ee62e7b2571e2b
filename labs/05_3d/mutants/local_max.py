"""Planted bug: a vocab-parallel softmax without the all-reduced max

Each rank shifts its exps by its *own* row maximum: the partial sums exp(z - m_r) are then in
different units and their all-reduced sum is wrong (right on one rank, where the local max is
the global one). The traffic is even 1/3 lower.

EXPECT_TASK: 5.2
EXPECT_MESSAGE: rank 0: the loss is
EXPECT_MESSAGE: every rank shifted by its own max, so the partial sums of exp(z - m_r) are in different units
"""
import numpy as np

from minipar.collectives import all_reduce
from minipar.labs.lab05_solution import *  # noqa: F401,F403  everything else is right
from minipar.xp import chunk_bounds


def vocab_parallel_cross_entropy(comm, logits, labels):
    lo, hi = chunk_bounds(logits.shape[-1], comm.size)[comm.rank]
    z = logits[..., lo:hi]
    z = z - z.max(axis=-1, keepdims=True)  # BUG: my max, not the all-reduced one
    e = np.exp(z)
    onehot = (labels[..., None] == np.arange(lo, hi)).astype(z.dtype)
    s, zl = all_reduce(comm, np.stack([e.sum(-1), (z * onehot).sum(-1)]))
    n = labels.size
    return np.sum(np.log(s) - zl) / n, (e / s[..., None] - onehot) / n
