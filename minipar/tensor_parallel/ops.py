"""The communication of tensor parallelism: conjugate pairs, each a forward and its backward.

A tensor-parallel layer is ordinary local math wrapped in a few operators that move data between
the ranks of the TP group. Every operator comes as a pair: what it sends in the forward, and
what its gradient must send in the backward. The backward of a copy is a sum, the backward of
a sum is a copy, the backward of a split is a gather and the backward of a gather is a split.

    op          forward                         backward
    ----------  ------------------------------  ------------------------------
    f           identity                        all-reduce            (before a column split)
    g           all-reduce                      identity              (after a row split)
    split       keep my chunk of the last axis  all-gather last axis  (input of a row split)
    gather      all-gather the last axis        keep my chunk         (output of a column split)
    sp_gather   all-gather the token axis       reduce-scatter tokens (sequence parallel: enter TP)
    sp_scatter  reduce-scatter the token axis   all-gather tokens     (sequence parallel: leave TP)

``f`` and ``g`` are the names of the Megatron-LM paper (Shoeybi et al. 2019, section 3).
Every function takes the communicator first (no global process group): pass the world, or the
TP row of a process grid. The collectives are minipar's own ring algorithms on send/recv.

The token axis is axis -2 (x is (B, T, C) or (N, C)). Splits must be even: a dimension that
p does not divide raises ``ValueError`` naming the dimension and p.
"""
from __future__ import annotations

from ..collectives import all_gather, all_reduce, reduce_scatter
from ..xp import contiguous, copy, namespace

TOKENS = -2  # the axis sequence parallelism splits: (B, T, C) -> (B, T/p, C)


# --------------------------------------------------------------------------- shards


def check_divisible(n: int, p: int, what: str, by: str | None = None) -> int:
    """n // p, or a ValueError naming the dimension when p does not divide it."""
    if n % p:
        raise ValueError(f"{what}={n} is not divisible by {by or 'the tensor-parallel size'} p={p}: "
                         f"the split needs equal shards")
    return n // p


def shard(full, p: int, r: int, axis: int = -1, what: str = "dim", by: str | None = None):
    """Chunk ``r`` of ``p`` equal chunks of ``full`` along ``axis`` (a copy, contiguous).

    Raises ValueError if p does not divide ``full.shape[axis]``.
    """
    n = check_divisible(full.shape[axis], p, what, by)
    index = [slice(None)] * full.ndim
    index[axis] = slice(r * n, (r + 1) * n)
    return copy(full[tuple(index)])


def _gather_axis(comm, x, axis):
    """All-gather along ``axis``: move it to the front (collectives work on axis 0) and back."""
    xp = namespace(x)
    front = contiguous(xp.moveaxis(x, axis, 0))  # (n/p, ...)
    return xp.moveaxis(all_gather(comm, front), 0, axis)  # (..., n, ...)


def _reduce_scatter_axis(comm, x, axis):
    """Reduce-scatter along ``axis``: my chunk of the sum over ranks."""
    xp = namespace(x)
    check_divisible(x.shape[axis], comm.size, "tokens" if axis == TOKENS else f"axis {axis}")
    front = contiguous(xp.moveaxis(x, axis, 0))  # (n, ...)
    return xp.moveaxis(reduce_scatter(comm, front), 0, axis)  # (..., n/p, ...)


def _my_chunk(comm, x, axis, what):
    return shard(x, comm.size, comm.rank, axis, what)


# --------------------------------------------------------------------------- f and g


def f_forward(comm, x):
    """f, forward: identity. Every rank already holds the whole input X of a column split."""
    return x


def f_backward(comm, dx):
    """f, backward: all-reduce. Rank r's dX = dY_r · A_r^T is only its columns' share of the
    gradient; the true dX is the sum over ranks."""
    return all_reduce(comm, dx)


def g_forward(comm, y):
    """g, forward: all-reduce. After a row split each rank holds a partial sum X_r · A_r;
    Y is their sum."""
    return all_reduce(comm, y)


def g_backward(comm, dy):
    """g, backward: identity. dY of a sum is the same dY for every term, already on every rank."""
    return dy


# --------------------------------------------------------------------------- split and gather (last axis)


def split_forward(comm, x, axis=-1):
    """split, forward: keep my chunk of ``axis`` (no message). Feeds a row split an input that
    every rank holds whole."""
    return _my_chunk(comm, x, axis, "d_in")


def split_backward(comm, dx, axis=-1):
    """split, backward: all-gather along ``axis``; each rank has the gradient of its chunk only."""
    return _gather_axis(comm, dx, axis)


def gather_forward(comm, y, axis=-1):
    """gather, forward: all-gather along ``axis``. Rebuilds Y = [Y_1 ... Y_p] after a column
    split (``gather_output=True``)."""
    return _gather_axis(comm, y, axis)


def gather_backward(comm, dy, axis=-1):
    """gather, backward: keep my chunk of ``axis`` (no message). Every rank holds the whole dY;
    rank r's columns only depend on its own chunk."""
    return _my_chunk(comm, dy, axis, "d_out")


# --------------------------------------------------------------------------- sequence parallelism


def sp_gather_forward(comm, x):
    """sp_gather, forward: all-gather the token axis. Outside the TP region each rank holds T/p
    tokens; the column split needs all T of them."""
    return _gather_axis(comm, x, TOKENS)


def sp_gather_backward(comm, dx):
    """sp_gather, backward: reduce-scatter the token axis. Each rank's dX (all T tokens) is its
    columns' share; sum over ranks and keep my T/p tokens, in one collective."""
    return _reduce_scatter_axis(comm, dx, TOKENS)


def sp_scatter_forward(comm, y):
    """sp_scatter, forward: reduce-scatter the token axis. Replaces g's all-reduce after a row
    split: sum the partial Y over ranks, keep my T/p tokens. (A ring all-reduce *is* a
    reduce-scatter followed by an all-gather: sequence parallelism moves the same bytes.)"""
    return _reduce_scatter_axis(comm, y, TOKENS)


def sp_scatter_backward(comm, dy):
    """sp_scatter, backward: all-gather the token axis; the row split needs dY for all tokens."""
    return _gather_axis(comm, dy, TOKENS)
