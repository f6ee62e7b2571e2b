"""Planted bug: a softmax with no shift at all

exp(z) straight away: right for small logits, inf (and then NaN) once a logit passes ~709 in
float64 or ~88 in float32. Subtracting the all-reduced max keeps every exponent <= 0.

EXPECT_TASK: 5.2
EXPECT_MESSAGE: exp overflowed (above ~709 in float64, ~88 in float32): subtract the row's max
"""
import math

from minipar.collectives import all_reduce
from minipar.labs.lab05_solution import *  # noqa: F401,F403  everything else is right
from minipar.xp import chunk_bounds, device, namespace


def vocab_parallel_cross_entropy(comm, logits, labels):
    xp = namespace(logits)
    lo, hi = chunk_bounds(logits.shape[-1], comm.size)[comm.rank]
    z = logits[..., lo:hi]
    all_reduce(comm, xp.max(z, axis=-1), op="max")  # the max all-reduced, then
    e = xp.exp(z)  # BUG: ... not subtracted
    onehot = xp.astype(labels[..., None] == xp.arange(lo, hi, device=device(z)), z.dtype)
    s, zl = all_reduce(comm, xp.stack([xp.sum(e, axis=-1), xp.sum(z * onehot, axis=-1)]))
    n = math.prod(labels.shape)
    return xp.sum(xp.log(s) - zl) / n, (e / s[..., None] - onehot) / n
