"""Planted bug: a vocab-parallel softmax without the all-reduced max

Each rank shifts its exps by its *own* row maximum: the partial sums exp(z - m_r) are then in
different units and their all-reduced sum is wrong (right on one rank, where the local max is
the global one). The traffic is even 1/3 lower.

EXPECT_TASK: 5.2
EXPECT_MESSAGE: rank 0: the loss is
EXPECT_MESSAGE: every rank shifted by its own max, so the partial sums of exp(z - m_r) are in different units
"""
import math

from minipar.collectives import all_reduce
from minipar.labs.lab05_solution import *  # noqa: F401,F403  everything else is right
from minipar.xp import chunk_bounds, device, namespace


def vocab_parallel_cross_entropy(comm, logits, labels):
    xp = namespace(logits)
    lo, hi = chunk_bounds(logits.shape[-1], comm.size)[comm.rank]
    z = logits[..., lo:hi]
    z = z - xp.max(z, axis=-1, keepdims=True)  # BUG: my max, not the all-reduced one
    e = xp.exp(z)
    onehot = xp.astype(labels[..., None] == xp.arange(lo, hi, device=device(z)), z.dtype)
    s, zl = all_reduce(comm, xp.stack([xp.sum(e, axis=-1), xp.sum(z * onehot, axis=-1)]))
    n = math.prod(labels.shape)
    return xp.sum(xp.log(s) - zl) / n, (e / s[..., None] - onehot) / n
