"""Lab 04's reference: data parallelism and ZeRO on flat arrays (NumPy or torch: the array
namespace of the inputs, ``minipar.xp``), with minipar's collectives."""
import math

from .. import collectives as C
from ..optim import adam_step
from ..xp import copy, namespace, size, zeros


def average_gradients(comm, grads):
    return [C.all_reduce(comm, g) / comm.size for g in grads]


def buckets_of(grads, bucket_bytes):
    """Greedy packing in the given order: indices per bucket; a gradient is never split, and a
    bucket may hold exactly bucket_bytes."""
    out, used = [], 0
    for i, g in enumerate(grads):
        if out and used + g.nbytes <= bucket_bytes:
            out[-1].append(i)
            used += g.nbytes
        else:
            out.append([i])
            used = g.nbytes
    return out


def bucketed_average(comm, grads, bucket_bytes):
    result = [None] * len(grads)
    for bucket in buckets_of(grads, bucket_bytes):
        flat = namespace(grads[0]).concat([grads[i].reshape(-1) for i in bucket])  # (sum of sizes,)
        flat = C.all_reduce(comm, flat) / comm.size
        start = 0
        for i in bucket:
            n = size(grads[i])
            result[i] = flat[start:start + n].reshape(grads[i].shape)
            start += n
    return result


def padded(x, p):
    """``x`` flattened and zero-padded to a multiple of p elements."""
    n_pad = -(-size(x) // p) * p
    out = zeros((n_pad,), like=x)
    out[:size(x)] = x.reshape(-1)
    return out


def updated_shard(comm, param, avg_grad, m, v, step, lr):
    """ZeRO-1's local half: Adam on this rank's shard of the zero-padded vectors (m, v in place)."""
    p, r = comm.size, comm.rank
    P, G = padded(param, p), padded(avg_grad, p)
    S = size(P) // p
    mine = slice(r * S, (r + 1) * S)
    shard = copy(P[mine])
    adam_step(shard, G[mine], m, v, step, lr)
    return shard


def zero1_update(comm, param, avg_grad, m, v, step, lr):
    return C.all_gather(comm, updated_shard(comm, param, avg_grad, m, v, step, lr))[:size(param)]


def zero2_grad_shard(comm, grad):
    return C.reduce_scatter(comm, padded(grad, comm.size)) / comm.size


def zero3_forward(comm, shards, shapes, x, layer):
    y = x
    for i, (shard, shape) in enumerate(zip(shards, shapes)):
        full = C.all_gather(comm, shard)
        w = full[:math.prod(shape)].reshape(shape)
        y = layer(i, w, y)
        del full, w
    return y
