"""Planted bug: reduce-scatter that forgets the remainder when p does not divide n

Chunks of n // p elements drop the last n % p elements: right whenever p divides n, wrong
otherwise (n = 7 on 2 ranks is the smallest failing case).

EXPECT_TASK: 1.3
EXPECT_MESSAGE: n=7 on 2 ranks
"""
import numpy as np

from minipar.xp import chunk_bounds


def ring_pass(comm, x):
    buf = np.empty_like(x)
    return comm.sendrecv(x, (comm.rank + 1) % comm.size, buf, (comm.rank - 1) % comm.size)


def tree_broadcast(comm, x, root=0):
    p, vr = comm.size, (comm.rank - root) % comm.size
    mask = 1
    while mask < p:
        if vr & mask:
            comm.recv(x, (vr - mask + root) % p)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:
        if vr + mask < p:
            comm.send(x, (vr + mask + root) % p)
        mask >>= 1
    return x


def ring_reduce_scatter(comm, x):
    p, r = comm.size, comm.rank
    q = len(x) // p  # BUG: ignores len(x) % p
    b = [(i * q, (i + 1) * q) for i in range(p)]
    buf = x.copy()
    for s in range(p - 1):
        sa, sb = b[(r - s - 1) % p]
        ra, rb = b[(r - s - 2) % p]
        tmp = np.empty(rb - ra, dtype=x.dtype)
        comm.sendrecv(buf[sa:sb], (r + 1) % p, tmp, (r - 1) % p)
        buf[ra:rb] += tmp
    a, c = b[r]
    return buf[a:c].copy()


def ring_all_gather(comm, chunk, counts):
    p, r = comm.size, comm.rank
    starts = np.concatenate([[0], np.cumsum(counts)])
    out = np.empty(starts[-1], dtype=chunk.dtype)
    out[starts[r]:starts[r + 1]] = chunk
    for s in range(p - 1):
        i, j = (r - s) % p, (r - s - 1) % p
        comm.sendrecv(out[starts[i]:starts[i + 1]], (r + 1) % p, out[starts[j]:starts[j + 1]], (r - 1) % p)
    return out


def ring_all_reduce(comm, x):
    b = chunk_bounds(len(x), comm.size)
    return ring_all_gather(comm, ring_reduce_scatter(comm, x), [hi - lo for lo, hi in b])


def predicted_ring_time(nbytes, p, alpha, beta):
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta
