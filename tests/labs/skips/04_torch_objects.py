"""Skips the technique: state gathered through objects (pickled Python objects, not ranks'
messages through comm): torch.distributed's own object calls on the communicator's process group
(comm.group), and comm.builtin's object transport. (On MPI, mpi4py's: tests/labs/skips/04_objects.py.)

BACKENDS: torch

EXPECT 4.1: rank 0 sent 0 bytes through comm; one ring all-reduce per gradient (5 gradients of [10, 3, 7, 20, 1] doubles) on 2 ranks sends 328
EXPECT 4.3: rank 0 called comm.builtin.allgather_object inside zero1_update
EXPECT 4.5: rank 0 called comm.builtin.allgather_object inside zero3_forward
"""
import math

import torch
import torch.distributed as dist

from minipar.labs.lab04_solution import updated_shard  # the honest part


def average_gradients(comm, grads):
    every = [None] * comm.size
    dist.all_gather_object(every, grads, group=comm.group)  # every rank's list of gradients, pickled
    return [sum(g[k] for g in every) / comm.size for k in range(len(grads))]


def zero1_update(comm, param, avg_grad, m, v, step, lr):
    shard = updated_shard(comm, param, avg_grad, m, v, step, lr)  # the honest local half
    return torch.cat(comm.builtin.allgather_object(shard))[:param.numel()]


def zero3_forward(comm, shards, shapes, x, layer):
    y = x
    for i, (shard, shape) in enumerate(zip(shards, shapes)):
        y = layer(i, torch.cat(comm.builtin.allgather_object(shard))[:math.prod(shape)].reshape(shape), y)
    return y
