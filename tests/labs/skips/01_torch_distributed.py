"""Skips the technique: lab 01 through torch.distributed's own collectives on the communicator's
process group (comm.group), outside comm: nothing goes through comm, so nothing is traced or
recorded as builtin. The exact traffic catches every one of them. (On MPI, mpi4py's own calls:
tests/labs/skips/01_mpi4py_collectives.py.)

BACKENDS: torch

EXPECT 1.1: rank 0 sent 0 bytes through comm; passing x (1 double) to the right neighbour on 1 rank sends 8: did you use a builtin collective
EXPECT 1.2: rank 1 received 0 messages (root 0, n=1 on 2 ranks); in a broadcast every rank but the root receives the data exactly once: did you use a builtin collective
EXPECT 1.3: rank 0 sent 0 bytes through comm; a ring reduce-scatter of 4 doubles on 2 ranks sends 16
EXPECT 1.4: rank 0 sent 0 bytes through comm; a ring all-gather of 4 doubles on 2 ranks sends 16
EXPECT 1.5: rank 0 sent 0 bytes through comm; a ring all-reduce of 12 doubles on 2 ranks sends 96: did you use a builtin collective
EXPECT 1.7: rank 0 sent 0 bytes through comm; a hierarchical all-reduce (n=12, 2 nodes x 1 rank) on 2 ranks sends 96: did you use a builtin collective
"""
import torch
import torch.distributed as dist

from minipar.xp import chunk_bounds


def ring_pass(comm, x):
    everyone = [torch.empty_like(x) for _ in range(comm.size)]
    dist.all_gather(everyone, x, group=comm.group)
    return everyone[(comm.rank - 1) % comm.size]


def tree_broadcast(comm, x, root=0):
    dist.broadcast(x, group_src=root, group=comm.group)
    return x


def ring_reduce_scatter(comm, x):
    total = x.clone()
    dist.all_reduce(total, group=comm.group)
    a, b = chunk_bounds(len(x), comm.size)[comm.rank]
    return total[a:b].clone()


def ring_all_gather(comm, chunk, counts):
    padded = torch.zeros(max(counts), dtype=chunk.dtype)
    padded[:len(chunk)] = chunk
    everyone = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(everyone, padded, group=comm.group)
    return torch.cat([part[:n] for part, n in zip(everyone, counts)])


def ring_all_reduce(comm, x):
    total = x.clone()
    dist.all_reduce(total, group=comm.group)
    return total


def hierarchical_all_reduce(comm, x, ranks_per_node):
    return ring_all_reduce(comm, x)
