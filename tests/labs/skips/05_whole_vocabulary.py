"""Skips the technique's point, not its messages: the max and the sums are all-reduced as they
should be, but every rank computes exp over the whole (B, T, V) logits and keeps its columns
afterwards: the values are right, the work (and the memory) is p times what the rank owns.
(The rule reads NumPy's watched arrays on one backend, torch's watched tensors on the other.)

BACKENDS: mpi torch

EXPECT 5.2: rank 0 computed with 288 elements of logits at once inside vocab_parallel_cross_entropy; it owns columns 0:12 of the logits (chunk_bounds(V, p)[rank]) (144 elements)
"""
import math

from minipar.collectives import all_reduce
from minipar.xp import chunk_bounds, device, namespace


def vocab_parallel_cross_entropy(comm, logits, labels):
    xp = namespace(logits)
    lo, hi = chunk_bounds(logits.shape[-1], comm.size)[comm.rank]
    m = all_reduce(comm, xp.max(logits[..., lo:hi], axis=-1), op="max")
    e = xp.exp(logits - m[..., None])[..., lo:hi]  # the whole vocabulary, then my columns
    onehot = xp.astype(labels[..., None] == xp.arange(lo, hi, device=device(e)), e.dtype)
    s, zl = all_reduce(comm, xp.stack([xp.sum(e, axis=-1), xp.sum((logits[..., lo:hi] - m[..., None]) * onehot, axis=-1)]))
    n = math.prod(labels.shape)
    return xp.sum(xp.log(s) - zl) / n, (e / s[..., None] - onehot) / n
