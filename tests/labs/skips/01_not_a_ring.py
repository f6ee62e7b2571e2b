"""Skips the technique with comm itself, right values: a broadcast as a chain (each rank passes
the data to the next: p-1 rounds, not log p), a reduce-scatter that all-reduces the whole
vector and keeps its chunk (minipar's all-reduce: twice the traffic), an all-reduce that sends
everything to rank 0 and back (naive).

EXPECT 1.2: rank 3 got the data 3 hops from root 0 (root 0, n=1 on 4 ranks); a binomial tree reaches every rank within ceil(log2 p) = 2 rounds
EXPECT 1.3: rank 0 sent 32 bytes through comm; a ring reduce-scatter of 4 doubles on 2 ranks sends exactly 16 (the trace shows all_reduce:ring x1)
EXPECT 1.5: rank 0 sent 1 messages; a ring all-reduce of 12 doubles on 2 ranks sends exactly 2
"""
from minipar.collectives import all_reduce
from minipar.xp import chunk_bounds, copy, empty


def tree_broadcast(comm, x, root=0):
    p, vr = comm.size, (comm.rank - root) % comm.size
    if vr > 0:
        comm.recv(x, (comm.rank - 1) % p)
    if vr < p - 1:
        comm.send(x, (comm.rank + 1) % p)
    return x


def ring_reduce_scatter(comm, x):
    a, b = chunk_bounds(len(x), comm.size)[comm.rank]
    return copy(all_reduce(comm, x)[a:b])


def ring_all_reduce(comm, x):
    if comm.rank == 0:
        total, tmp = copy(x), empty(x.shape, like=x)
        for src in range(1, comm.size):
            total += comm.recv(tmp, src)
        for dst in range(1, comm.size):
            comm.send(total, dst)
        return total
    comm.send(x, 0)
    return comm.recv(empty(x.shape, like=x), 0)
