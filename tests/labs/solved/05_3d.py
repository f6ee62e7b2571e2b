"""Lab 05 solved as a learner would: numpy slicing for the groups, minipar.collectives.all_reduce
and comm.sendrecv for the messages, the array namespace of the inputs (minipar.xp) for the math,
nothing else (no solution module). Must pass `minipar check 05 --file` on both backends."""
import math

import numpy as np

from minipar.collectives import all_reduce
from minipar.xp import chunk_bounds, device, empty, namespace, zeros


def grid_groups(dp, pp, tp, rank):
    ranks = np.arange(dp * pp * tp).reshape(dp, pp, tp)
    d, p, t = np.argwhere(ranks == rank)[0]
    emb = [int(ranks[d, 0, t]), int(ranks[d, -1, t])] if pp > 1 and p in (0, pp - 1) else None
    return {"tp": ranks[d, p, :].tolist(), "pp": ranks[d, :, t].tolist(), "dp": ranks[:, p, t].tolist(), "emb": emb}


def vocab_parallel_cross_entropy(comm, logits, labels):
    xp = namespace(logits)
    lo, hi = chunk_bounds(logits.shape[-1], comm.size)[comm.rank]
    z = logits[..., lo:hi]  # (B, T, V/p): mine only
    m = all_reduce(comm, xp.max(z, axis=-1), op="max")  # (B, T): the same shift everywhere
    e = xp.exp(z - m[..., None])
    onehot = xp.astype(labels[..., None] == xp.arange(lo, hi, device=device(z)), z.dtype)  # (B, T, V/p): my columns
    label_z = xp.sum((z - m[..., None]) * onehot, axis=-1)  # (B, T): 0 where the label is another rank's
    s, label_z = all_reduce(comm, xp.stack([xp.sum(e, axis=-1), label_z]))  # (2, B, T) summed over the vocabulary
    n = math.prod(labels.shape)
    loss = xp.sum(xp.log(s) - label_z) / n
    return loss, (e / s[..., None] - onehot) / n


def sync_tied(pp, grad):
    if pp.size == 1 or grad is None:
        return grad
    other = pp.size - 1 if pp.rank == 0 else 0
    theirs = pp.sendrecv(grad, other, empty(grad.shape, like=grad), other)
    return grad + theirs  # a + b == b + a bitwise: both ends get the same sum


def train_step(grid, pipeline, grads, tied):
    for g in grads:
        g[...] = 0
    pipeline()
    s = sync_tied(grid.pp, tied)
    if s is not None:
        tied[...] = s
    for g in grads:
        g[...] = all_reduce(grid.dp, g) / grid.dp.size


def dropout_mask(comm, key, rows, positions, cols, shape, p):
    k = np.random.SeedSequence(list(key)).generate_state(2, np.uint64)  # Philox's key from (seed, step, layer, site)
    lo, hi = cols
    out = []
    for r in rows:  # the counter is the global row: any rank can start there
        u = np.random.Generator(np.random.Philox(key=k, counter=[0, int(r), 0, 0])).random(shape)  # (T, D)
        out.append(u[np.asarray(positions)][:, lo:hi] >= p)
    return np.stack(out)


def global_grad_norm(grid, grads):
    d, p, t = grid.coords
    last = grid.pp.size - 1
    mine = zeros((1,), like=grads[0][1])  # float64, of the backend's kind
    for name, g, split, (lo, hi) in grads:
        if not split and t != 0:
            continue  # whole on every TP rank: TP rank 0 counts it for all of them
        if name == "wte" and last > 0 and p == last:
            continue  # the head's copy of the tied embedding: the first stage counts it
        mine += (g[lo:hi] ** 2).sum()  # my ZeRO shard only: the rest is NaN
    return math.sqrt(float(all_reduce(grid.world, mine)[0]))
