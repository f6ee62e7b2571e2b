"""Planted bug: the ring reduce-scatter sends the wrong chunk (off by one)

In step s rank r must send chunk (r - s - 1) % p; this sends (r - s) % p, so partial sums
land on the wrong chunk and every rank ends with a wrong chunk of the sum.

EXPECT_TASK: 1.3
EXPECT_MESSAGE: rank 0: its chunk 0 of the sum (chunk = elements 0:2), element 0: expected
"""
from minipar.labs.lab01_solution import *  # noqa: F401,F403  everything else is right
from minipar.xp import chunk_bounds, copy, empty  # noqa: F401


def ring_reduce_scatter(comm, x):
    p, r = comm.size, comm.rank
    b = chunk_bounds(len(x), p)
    buf = copy(x)
    for s in range(p - 1):
        sa, sb = b[(r - s) % p]  # BUG: off by one
        ra, rb = b[(r - s - 2) % p]
        tmp = empty((rb - ra,), like=x)
        comm.sendrecv(buf[sa:sb], (r + 1) % p, tmp, (r - 1) % p)
        buf[ra:rb] += tmp
    a, c = b[r]
    return copy(buf[a:c])
