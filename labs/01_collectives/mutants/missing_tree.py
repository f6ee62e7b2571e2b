"""Planted bug: broadcast as a loop over all ranks, not a tree

The root sends to every rank in turn: the right data, but p-1 messages from one rank
instead of ceil(log2 p): the root's link is the bottleneck the tree removes.

EXPECT_TASK: 1.2
EXPECT_MESSAGE: a binomial tree sends at most
"""
import numpy as np

from minipar.xp import chunk_bounds


def ring_pass(comm, x):
    buf = np.empty_like(x)
    return comm.sendrecv(x, (comm.rank + 1) % comm.size, buf, (comm.rank - 1) % comm.size)


def tree_broadcast(comm, x, root=0):
    if comm.rank == root:  # BUG: linear, not a tree
        for r in range(comm.size):
            if r != root:
                comm.send(x, r)
    else:
        comm.recv(x, root)
    return x


def _unused_tree_broadcast(comm, x, root=0):
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
    b = chunk_bounds(len(x), p)
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
