"""Skips the technique: the right groups and the right sums, but through the engine's own
all-reduce (comm.builtin) instead of minipar.collectives: the softmax's max and sums, the tied
gradient's sum over the two ends, the DP average, the global norm's sum of squares. comm.builtin
is MPI's or torch.distributed's: graded on both.

BACKENDS: mpi torch

EXPECT 5.2: rank 0 called comm.builtin.all_reduce inside vocab_parallel_cross_entropy: comm.builtin is the engine's own collective
EXPECT 5.3: rank 0 called comm.builtin.all_reduce inside sync_tied
EXPECT 5.4: rank 0 called comm.builtin.all_reduce inside train_step
EXPECT 5.6: rank 0 called comm.builtin.all_reduce inside global_grad_norm
"""
import math

from minipar.xp import chunk_bounds, device, namespace, zeros


def vocab_parallel_cross_entropy(comm, logits, labels):
    xp = namespace(logits)
    lo, hi = chunk_bounds(logits.shape[-1], comm.size)[comm.rank]
    z = logits[..., lo:hi]
    z = z - comm.builtin.all_reduce(xp.max(z, axis=-1, keepdims=True), op="max")
    e = xp.exp(z)
    onehot = xp.astype(labels[..., None] == xp.arange(lo, hi, device=device(z)), z.dtype)
    s, zl = comm.builtin.all_reduce(xp.stack([xp.sum(e, axis=-1), xp.sum(z * onehot, axis=-1)]))
    n = math.prod(labels.shape)
    return xp.sum(xp.log(s) - zl) / n, (e / s[..., None] - onehot) / n


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
    mine = zeros((1,), like=grads[0][1])
    for name, g, split, (lo, hi) in grads:
        if (split or t == 0) and not (name == "wte" and p == grid.pp.size - 1 and p > 0):
            mine += (g[lo:hi] ** 2).sum()
    return math.sqrt(float(grid.world.builtin.all_reduce(mine)[0]))
