"""Lab 04: data parallelism and ZeRO.

Fill in each function below, then run it on real ranks and grade it:

    mpiexec -n 4 python -m mpi4py minipar-labs/04_zero/exercise.py     # see what your code does
    torchrun --standalone --nproc-per-node 4 minipar-labs/04_zero/exercise.py   # the same, torch
    minipar check 04                                           # grade every task
    minipar check 04 --task 4.3                                # grade one task
    minipar check 04 --backend torch                           # grade it on torch tensors

Communicate with minipar.collectives (all_reduce, reduce_scatter, all_gather: rings on
send/recv, traced, so the grader can count what you sent). comm.builtin is off limits.
Arrays are 1-D float64 unless a docstring says otherwise.

One code, two backends: the arrays are NumPy arrays under MPI and torch tensors under
torch.distributed. Allocate, copy and concatenate through minipar.xp, which follows its
argument's kind, dtype and device: zeros(shape, like=x), copy(x), size(x) (elements),
namespace(x).concat([...]) (NumPy's or torch's functions, by the array-API names).

The grader checks the technique, not only the values: the bytes each rank sends must be exactly
what the task's collective sends (a reduce-scatter is not an all-reduce), the parts of the
averaged gradient other ranks update are NaN on your rank in 4.3, and in 4.5 it counts the
bytes your call holds at its peak: one layer's full weights at a time.
"""
import math  # noqa: F401  math.prod(shape): elements of a shape

import numpy as np

import minipar
from minipar.collectives import all_gather, all_reduce, reduce_scatter  # noqa: F401
from minipar.optim import adam_step  # noqa: F401  adam_step(param, grad, m, v, step, lr): in place
from minipar.xp import copy, namespace, size, zeros  # noqa: F401  x's kind (NumPy or torch), dtype, device


def average_gradients(comm, grads):
    """DDP: every rank computed gradients on its own data; return their average over the ranks.

    grads: a list of arrays (any shapes). Return a list of arrays of the same shapes, each the
    elementwise mean over the p ranks, identical on every rank.
    """
    # TODO(lab4.1): one all_reduce per gradient (a sum), then divide by p, once
    raise NotImplementedError("lab 4.1")


def bucketed_average(comm, grads, bucket_bytes):
    """The same average with far fewer messages: pack the gradients into flat buckets.

    Walk the gradients in order; add each one to the current bucket while the bucket stays
    <= bucket_bytes (g.nbytes; a bucket may hold exactly bucket_bytes), else start a new bucket.
    A gradient is never split (one bigger than bucket_bytes gets a bucket of its own). One
    all_reduce per bucket; then unpack.
    """
    # TODO(lab4.2): group indices into buckets, concatenate each bucket's flattened gradients
    #               (namespace(g).concat), all_reduce it, divide by p, cut it back into the shapes
    raise NotImplementedError("lab 4.2")


def zero1_update(comm, param, avg_grad, m, v, step, lr):
    """ZeRO-1: every rank holds Adam's state for its shard only; update it, then all-gather.

    param, avg_grad: length-n vectors, the same on every rank (the gradient is already averaged;
    only your shard of it is needed, and the grader sets the rest to NaN).
    Pad both with zeros to n_pad = ceil(n / p) * p; rank r owns the shard [r*S, (r+1)*S), S = n_pad/p.
    m, v: Adam's moments for that shard (S elements each): update them in place.
    Return the new parameter (length n) on every rank.
    """
    # TODO(lab4.3): pad, adam_step on a copy of your shard, all_gather the shards, strip the padding
    raise NotImplementedError("lab 4.3")


def zero2_grad_shard(comm, grad):
    """ZeRO-2: return this rank's shard (S elements) of the averaged, zero-padded gradient.

    grad: this rank's local gradient (length n, different on every rank). A reduce-scatter
    gives rank r the sum of shard r at half the traffic of an all-reduce; nobody keeps the rest.
    """
    # TODO(lab4.4): pad with zeros to a multiple of p, reduce_scatter, divide by p
    raise NotImplementedError("lab 4.4")


def zero3_forward(comm, shards, shapes, x, layer):
    """ZeRO-3: the weights exist in full only while their layer computes.

    shards[i]: this rank's shard of layer i's weights, flattened and zero-padded (S_i elements);
    shapes[i]: the full weight's shape. For each layer in turn: all_gather the shards, strip the
    padding, reshape, y = layer(i, w, y), and free the full weights before the next layer.
    Return the last y.
    """
    # TODO(lab4.5): gather on demand, one layer at a time
    raise NotImplementedError("lab 4.5")


if __name__ == "__main__":
    comm = minipar.init("auto")  # NumPy over MPI under mpiexec, torch tensors under torchrun
    g = comm.asarray(np.random.default_rng(comm.rank).standard_normal(7))
    for name, call in [("average_gradients", lambda: average_gradients(comm, [g])[0]),
                       ("zero2_grad_shard", lambda: zero2_grad_shard(comm, g))]:
        try:
            print(f"rank {comm.rank}: {name} -> {call()}", flush=True)
        except NotImplementedError as e:
            print(f"rank {comm.rank}: {name} not implemented yet ({e})", flush=True)
    if comm.rank == 0:
        print("now grade it: minipar check 04")
