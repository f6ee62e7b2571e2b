"""Skips the technique: lab 01 through mpi4py's own calls on the communicator's MPI handle
(comm.mpi), outside comm: nothing goes through comm, so nothing is traced or recorded as
builtin. The exact traffic catches every one of them. (On torch, tests/labs/skips/01_torch_distributed.py.)

BACKENDS: mpi

EXPECT 1.1: rank 0 sent 0 bytes through comm; passing x (1 double) to the right neighbour on 1 rank sends 8: did you use a builtin collective
EXPECT 1.2: rank 1 received 0 messages (root 0, n=1 on 2 ranks); in a broadcast every rank but the root receives the data exactly once: did you use a builtin collective
EXPECT 1.3: rank 0 sent 0 bytes through comm; a ring reduce-scatter of 4 doubles on 2 ranks sends 16
EXPECT 1.4: rank 0 sent 0 bytes through comm; a ring all-gather of 4 doubles on 2 ranks sends 16
EXPECT 1.5: rank 0 sent 0 bytes through comm; a ring all-reduce of 12 doubles on 2 ranks sends 96: did you use a builtin collective
EXPECT 1.7: rank 0 sent 0 bytes through comm; a hierarchical all-reduce (n=12, 2 nodes x 1 rank) on 2 ranks sends 96: did you use a builtin collective
"""
import numpy as np
from mpi4py import MPI

from minipar.xp import chunk_bounds


def ring_pass(comm, x):
    buf = np.empty_like(x)
    comm.mpi.Sendrecv(x, (comm.rank + 1) % comm.size, recvbuf=buf, source=(comm.rank - 1) % comm.size)
    return buf


def tree_broadcast(comm, x, root=0):
    comm.mpi.Bcast(x, root)
    return x


def ring_reduce_scatter(comm, x):
    counts = [b - a for a, b in chunk_bounds(len(x), comm.size)]
    out = np.empty(counts[comm.rank])
    comm.mpi.Reduce_scatter(x, out, counts, MPI.SUM)
    return out


def ring_all_gather(comm, chunk, counts):
    out = np.empty(sum(counts))
    comm.mpi.Allgatherv(chunk, [out, counts])
    return out


def ring_all_reduce(comm, x):
    out = np.empty_like(x)
    comm.mpi.Allreduce(x, out, MPI.SUM)
    return out


def hierarchical_all_reduce(comm, x, ranks_per_node):
    return ring_all_reduce(comm, x)
