"""Lab 01 solved as a learner would: every task written in the exercise file's style, with
nothing but comm.sendrecv / send / recv (no minipar.collectives, no solution module).
Graded through `minipar check 01 --file` like any exercise; it must pass every task."""
from minipar.xp import chunk_bounds, copy, empty


def ring_pass(comm, x):
    buf = empty(x.shape, like=x)
    return comm.sendrecv(x, (comm.rank + 1) % comm.size, buf, (comm.rank - 1) % comm.size)


def tree_broadcast(comm, x, root=0):
    p, vr = comm.size, (comm.rank - root) % comm.size
    k = 1
    while k < p:  # round log2(k): ranks vr < k have the data and send it k further
        if vr < k and vr + k < p:
            comm.send(x, (vr + k + root) % p)
        elif k <= vr < 2 * k:
            comm.recv(x, (vr - k + root) % p)
        k *= 2
    return x


def ring_reduce_scatter(comm, x):
    p, r = comm.size, comm.rank
    b = chunk_bounds(len(x), p)
    buf = copy(x)
    for s in range(p - 1):
        sa, sb = b[(r - s - 1) % p]
        ra, rb = b[(r - s - 2) % p]
        tmp = empty((rb - ra,), like=x)
        comm.sendrecv(buf[sa:sb], (r + 1) % p, tmp, (r - 1) % p)
        buf[ra:rb] += tmp
    a, c = b[r]
    return copy(buf[a:c])


def ring_all_gather(comm, chunk, counts):
    p, r = comm.size, comm.rank
    starts = [sum(counts[:i]) for i in range(p + 1)]  # chunk i is out[starts[i]:starts[i + 1]]
    out = empty((starts[-1],), like=chunk)
    out[starts[r]:starts[r + 1]] = chunk
    for s in range(p - 1):
        i, j = (r - s) % p, (r - s - 1) % p
        recv = empty((counts[j],), like=chunk)
        comm.sendrecv(copy(out[starts[i]:starts[i + 1]]), (r + 1) % p, recv, (r - 1) % p)
        out[starts[j]:starts[j + 1]] = recv
    return out


def ring_all_reduce(comm, x):
    counts = [b - a for a, b in chunk_bounds(len(x), comm.size)]
    return ring_all_gather(comm, ring_reduce_scatter(comm, x), counts)


def hierarchical_all_reduce(comm, x, ranks_per_node):
    R = ranks_per_node
    node = comm.split(comm.rank // R, key=comm.rank)  # the ranks of my node
    peers = comm.split(comm.rank % R, key=comm.rank)  # my local rank on every node
    shard = ring_all_reduce(peers, ring_reduce_scatter(node, x))  # only my shard crosses the nodes
    return ring_all_gather(node, shard, [b - a for a, b in chunk_bounds(len(x), R)])


def predicted_ring_time(nbytes, p, alpha, beta):
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta
