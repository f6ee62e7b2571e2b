"""Skips the technique with minipar's own collectives: ZeRO-1 as plain data parallelism (every
rank updates the whole parameter with full Adam state, no all-gather), ZeRO-2 with a full
all-reduce and a slice, ZeRO-3 gathering every layer up front (each freed after its use, but
all held at once), and bucketing that ignores the buckets.

BACKENDS: mpi torch  (the memory rule counts NumPy's buffers on one, torch's storages on the other)

EXPECT 4.2: bucket_bytes=100: expected 4 calls of minipar.collectives.all_reduce for buckets [[0], [1, 2], [3], [4]]
EXPECT 4.3: rank 0: the new parameter is NaN at element 5 (5 of 10 elements NaN): rank 0 computed with data it does not own
EXPECT 4.4: rank 0 sent 80 bytes through comm; a ring reduce-scatter of the padded gradient (n=10 on 2 ranks; padded to 10, rank 0's shard = [0, 5)) on 2 ranks sends exactly 40 (the trace shows all_reduce:ring x1)
EXPECT 4.5: inside zero3_forward; ZeRO-3 holds one layer's full weights at a time: the largest layer (32760 bytes, padded)
EXPECT 4.5: 4 gathered layers were alive at once (full[0] of zero3_forward, full[2] of zero3_forward, full[1] of zero3_forward, full[3] of zero3_forward)
"""
import math

from minipar.collectives import all_gather, all_reduce
from minipar.labs.lab04_solution import padded  # zero padding to a multiple of p
from minipar.optim import adam_step
from minipar.xp import copy, namespace, size, zeros

_state = {}


def bucketed_average(comm, grads, bucket_bytes):
    flat = all_reduce(comm, namespace(grads[0]).concat([g.reshape(-1) for g in grads])) / comm.size  # one bucket
    out, at = [], 0
    for g in grads:
        out.append(flat[at:at + size(g)].reshape(g.shape))
        at += size(g)
    return out


def zero1_update(comm, param, avg_grad, m, v, step, lr):
    if step == 1:
        _state["m"], _state["v"] = zeros((size(param),), like=param), zeros((size(param),), like=param)
    new = copy(param)
    adam_step(new, avg_grad, _state["m"], _state["v"], step, lr)  # the whole vector on every rank
    S = size(m)
    lo = comm.rank * S
    hi = min(lo + S, size(param))
    m[:max(hi - lo, 0)], v[:max(hi - lo, 0)] = _state["m"][lo:hi], _state["v"][lo:hi]
    return new


def zero2_grad_shard(comm, grad):
    p, r = comm.size, comm.rank
    G = padded(grad, p)
    S = size(G) // p
    return all_reduce(comm, G)[r * S:(r + 1) * S] / p


def zero3_forward(comm, shards, shapes, x, layer):
    full = [all_gather(comm, s)[:math.prod(shape)].reshape(shape) for s, shape in zip(shards, shapes)]
    y = x
    for i in range(len(full)):
        y = layer(i, full[i], y)
        full[i] = None  # freed after use: too late, all were held at once
    return y
