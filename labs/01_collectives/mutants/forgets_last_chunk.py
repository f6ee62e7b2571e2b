"""Planted bug: reduce-scatter that forgets the remainder when p does not divide n

Chunks of n // p elements drop the last n % p elements: right whenever p divides n, wrong
otherwise (n = 7 on 2 ranks is the smallest failing case).

EXPECT_TASK: 1.3
EXPECT_MESSAGE: rank 0 returned 3 elements for n=7 on 2 ranks; its chunk 0 is elements 0:4 (4 elements) = chunk_bounds(7, 2)[0]
"""
from minipar.labs.lab01_solution import *  # noqa: F401,F403  everything else is right
from minipar.xp import chunk_bounds, copy, empty  # noqa: F401


def ring_reduce_scatter(comm, x):
    p, r = comm.size, comm.rank
    q = len(x) // p  # BUG: ignores len(x) % p
    b = [(i * q, (i + 1) * q) for i in range(p)]
    buf = copy(x)
    for s in range(p - 1):
        sa, sb = b[(r - s - 1) % p]
        ra, rb = b[(r - s - 2) % p]
        tmp = empty((rb - ra,), like=x)
        comm.sendrecv(buf[sa:sb], (r + 1) % p, tmp, (r - 1) % p)
        buf[ra:rb] += tmp
    a, c = b[r]
    return copy(buf[a:c])
