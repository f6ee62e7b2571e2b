"""Skips the technique: lab 01's collectives by the engine's own (comm.builtin), the right values.

BACKENDS: mpi torch  (torch's builtins differ from MPI's (its reduce_scatter is its all_reduce))

EXPECT 1.3: rank 0 called comm.builtin.reduce_scatter inside ring_reduce_scatter: comm.builtin is the engine's own collective
EXPECT 1.4: rank 0 called comm.builtin.all_gather inside ring_all_gather
EXPECT 1.5: rank 0 called comm.builtin.all_reduce inside ring_all_reduce
EXPECT 1.7: rank 0 called comm.builtin.all_reduce inside hierarchical_all_reduce
"""


def ring_reduce_scatter(comm, x):
    return comm.builtin.reduce_scatter(x)


def ring_all_gather(comm, chunk, counts):
    return comm.builtin.all_gather(chunk)


def ring_all_reduce(comm, x):
    return comm.builtin.all_reduce(x)


def hierarchical_all_reduce(comm, x, ranks_per_node):
    return comm.builtin.all_reduce(x)
