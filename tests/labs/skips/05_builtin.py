"""Skips the technique: the right groups and the right sums, but through the engine's own
all-reduce (comm.builtin) instead of minipar.collectives: the softmax's max and sums, the tied
gradient's sum over the two ends, the DP average, the global norm's sum of squares.

EXPECT 5.2: rank 0 called comm.builtin.all_reduce inside vocab_parallel_cross_entropy: comm.builtin is the engine's own collective
EXPECT 5.3: rank 0 called comm.builtin.all_reduce inside sync_tied
EXPECT 5.4: rank 0 called comm.builtin.all_reduce inside train_step
EXPECT 5.6: rank 0 called comm.builtin.all_reduce inside global_grad_norm
"""
import numpy as np

from minipar.xp import chunk_bounds


def vocab_parallel_cross_entropy(comm, logits, labels):
    lo, hi = chunk_bounds(logits.shape[-1], comm.size)[comm.rank]
    z = logits[..., lo:hi]
    z = z - comm.builtin.all_reduce(np.ascontiguousarray(z.max(-1, keepdims=True)), op="max")
    e = np.exp(z)
    onehot = (labels[..., None] == np.arange(lo, hi)).astype(z.dtype)
    s, zl = comm.builtin.all_reduce(np.stack([e.sum(-1), (z * onehot).sum(-1)]))
    n = labels.size
    return np.sum(np.log(s) - zl) / n, (e / s[..., None] - onehot) / n


def sync_tied(pp, grad):
    ends = pp.split(0 if pp.rank in (0, pp.size - 1) and pp.size > 1 else None, key=pp.rank)
    return grad if ends is None else ends.builtin.all_reduce(grad)


def train_step(grid, pipeline, grads, tied):
    for g in grads:
        g[...] = 0
    pipeline()
    if tied is not None:
        tied[...] = sync_tied(grid.pp, tied)
    for g in grads:
        g[...] = grid.dp.builtin.all_reduce(g) / grid.dp.size


def global_grad_norm(grid, grads):
    d, p, t = grid.coords
    mine = sum(float(np.sum(g[lo:hi] ** 2)) for name, g, split, (lo, hi) in grads
               if (split or t == 0) and not (name == "wte" and p == grid.pp.size - 1 and p > 0))
    return float(np.sqrt(grid.world.builtin.all_reduce(np.array([mine]))[0]))
