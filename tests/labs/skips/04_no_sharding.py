"""Skips the technique with minipar's own collectives: ZeRO-1 as plain data parallelism (every
rank updates the whole parameter with full Adam state, no all-gather), ZeRO-2 with a full
all-reduce and a slice, ZeRO-3 gathering every layer up front (each freed after its use, but
all held at once), and bucketing that ignores the buckets.

BACKENDS: mpi torch  (torch's memory count is its own (tensor storages), NumPy's tracemalloc)

EXPECT 4.2: bucket_bytes=100: expected 4 calls of minipar.collectives.all_reduce for buckets [[0], [1, 2], [3], [4]]
EXPECT 4.3: rank 0: the new parameter is NaN at element 5 (5 of 10 elements NaN): rank 0 computed with data it does not own
EXPECT 4.4: rank 0 sent 80 bytes through comm; a ring reduce-scatter of the padded gradient (n=10 on 2 ranks; padded to 10, rank 0's shard = [0, 5)) on 2 ranks sends exactly 40 (the trace shows all_reduce:ring x1)
EXPECT 4.5: inside zero3_forward; ZeRO-3 holds one layer's full weights at a time: twice the largest layer (32760 bytes, padded)
"""
import numpy as np

from minipar.collectives import all_gather, all_reduce
from minipar.labs.lab04_solution import padded  # zero padding to a multiple of p
from minipar.optim import adam_step

_state = {}


def bucketed_average(comm, grads, bucket_bytes):
    flat = all_reduce(comm, np.concatenate([g.ravel() for g in grads])) / comm.size  # one bucket, always
    out, at = [], 0
    for g in grads:
        out.append(flat[at:at + g.size].reshape(g.shape))
        at += g.size
    return out


def zero1_update(comm, param, avg_grad, m, v, step, lr):
    if step == 1:
        _state["m"], _state["v"] = np.zeros(param.size), np.zeros(param.size)
    new = param.copy()
    adam_step(new, avg_grad, _state["m"], _state["v"], step, lr)  # the whole vector on every rank
    S = m.size
    lo = comm.rank * S
    hi = min(lo + S, param.size)
    m[:max(hi - lo, 0)], v[:max(hi - lo, 0)] = _state["m"][lo:hi], _state["v"][lo:hi]
    return new


def zero2_grad_shard(comm, grad):
    p, r = comm.size, comm.rank
    G = padded(grad, p)
    S = G.size // p
    return all_reduce(comm, G)[r * S:(r + 1) * S] / p


def zero3_forward(comm, shards, shapes, x, layer):
    full = [all_gather(comm, s)[:int(np.prod(shape))].reshape(shape) for s, shape in zip(shards, shapes)]
    y = x
    for i in range(len(full)):
        y = layer(i, full[i], y)
        full[i] = None  # freed after use: too late, all were held at once
    return y
