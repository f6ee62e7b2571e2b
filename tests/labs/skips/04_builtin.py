"""Skips the technique: gradient averaging and ZeRO's collectives by the engine's own
(comm.builtin), including a full all-reduce where ZeRO-2 asks for a reduce-scatter. comm.builtin
is MPI's or torch.distributed's: graded on both.

BACKENDS: mpi torch

EXPECT 4.1: rank 0 called comm.builtin.all_reduce inside average_gradients: comm.builtin is the engine's own collective
EXPECT 4.3: rank 0 called comm.builtin.all_gather inside zero1_update
EXPECT 4.4: rank 0 called comm.builtin.all_reduce inside zero2_grad_shard
EXPECT 4.5: rank 0 called comm.builtin.all_gather inside zero3_forward
"""
import math

from minipar.labs.lab04_solution import padded, updated_shard  # the honest parts
from minipar.xp import size


def average_gradients(comm, grads):
    return [comm.builtin.all_reduce(g) / comm.size for g in grads]


def zero1_update(comm, param, avg_grad, m, v, step, lr):
    shard = updated_shard(comm, param, avg_grad, m, v, step, lr)  # the honest local half
    return comm.builtin.all_gather(shard)[:size(param)]


def zero2_grad_shard(comm, grad):
    p, r = comm.size, comm.rank
    G = padded(grad, p)
    S = size(G) // p
    return comm.builtin.all_reduce(G)[r * S:(r + 1) * S] / p  # the whole sum, then my shard


def zero3_forward(comm, shards, shapes, x, layer):
    y = x
    for i, (shard, shape) in enumerate(zip(shards, shapes)):
        y = layer(i, comm.builtin.all_gather(shard)[:math.prod(shape)].reshape(shape), y)
    return y
