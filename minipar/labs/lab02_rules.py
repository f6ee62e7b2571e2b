"""Lab 02's shards and rules, shared by its guided checks (``minipar.labs.lab02``) and its core
checks (``minipar.labs.lab02_core``): a rank's chunk, its poisoned and watched shard, the traffic of
one ring all-reduce, and the bias counted p times."""
from __future__ import annotations

import numpy as np

from ..xp import chunk_bounds, to_numpy
from .checks import chunk_counts, expect_traffic, poisoned, ring_traffic, watched

INSTEAD = "minipar.collectives.all_reduce (a ring on send/recv)"


def mine(comm, n):
    """(lo, hi): this rank's chunk of n."""
    return chunk_bounds(n, comm.size)[comm.rank]


def cols(comm, a):
    """My columns chunk of a (last axis)."""
    lo, hi = mine(comm, a.shape[-1])
    return a[..., lo:hi]


def rows(comm, a):
    lo, hi = mine(comm, a.shape[0])
    return a[lo:hi]


def shard(comm, a, keep, what):
    """(a watched copy of a in the backend's kind, NaN outside a[keep]; its entry for used_only_own)."""
    w = watched(comm.asarray(poisoned(a, keep)))
    return w, (w, int(np.ones(a.shape)[keep].size), what)


def _close(got, want, tol=1e-12):
    g = to_numpy(got) if got is not None else None
    return g is not None and g.shape == want.shape and np.allclose(g, want, rtol=tol, atol=tol)


def one_all_reduce(comm, g, shape, what, why=""):
    """The traffic of one ring all-reduce of an array of ``shape`` (float64)."""
    n = int(np.prod(shape))
    nbytes, msgs = ring_traffic(chunk_counts(n, comm.size), comm.rank, 8)
    return expect_traffic(comm, g, f"one ring all-reduce of the {shape} {what}", nbytes, msgs,
                          hint="it is the only message (minipar.collectives.all_reduce); gathering shards, or a "
                               "second collective, sends other counts" + (f"; {why}" if why else ""))


def no_message(comm, g, why):
    return expect_traffic(comm, g, why, 0, 0)


def _bias_once(comm, got, want, b, what):
    """A pinpointed message when got = want + (p - 1) b: the bias went in before the sum."""
    if comm.size > 1 and _close(got, want + (comm.size - 1) * b):
        return [f"rank {comm.rank}: {what} is off by exactly (p-1)*b = {comm.size - 1}*b: the bias was added on "
                f"every rank before the all-reduce, so the sum holds it p times; add it once, after the sum"]
    return []
