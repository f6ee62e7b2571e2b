"""Skips the technique by calling minipar's own collectives and cost model: the right values,
and the right messages on the right links in the right sizes (minipar's broadcast is a binomial
tree, its reduce-scatter, all-gather and all-reduce are rings), but the learner wrote none of
them. The trace records who made every send and receive: here minipar.collectives, not the
exercise. The cost model is minipar's own function, run inside the learner's.

EXPECT 1.2: rank 0's send to rank 1 (8 bytes) was made by minipar's own code, minipar/collectives.py:
EXPECT 1.2: in broadcast(), called at tests/labs/skips/01_minipar_reference.py:20: write tree_broadcast's messages yourself, with comm.sendrecv
EXPECT 1.3: was made by minipar's own code, minipar/collectives.py:
EXPECT 1.3: called at tests/labs/skips/01_minipar_reference.py:24: write ring_reduce_scatter's messages yourself
EXPECT 1.4: called at tests/labs/skips/01_minipar_reference.py:28: write ring_all_gather's messages yourself
EXPECT 1.5: called at tests/labs/skips/01_minipar_reference.py:32: write ring_all_reduce's messages yourself
EXPECT 1.7: hierarchical_all_reduce ran minipar's own minipar.collectives.hierarchical_all_reduce
EXPECT 1.6: predicted_ring_time ran minipar's own minipar.costmodel.allreduce_time (called at tests/labs/skips/01_minipar_reference.py:36
"""
from minipar import collectives, costmodel


def tree_broadcast(comm, x, root=0):
    return collectives.broadcast(comm, x, root)


def ring_reduce_scatter(comm, x):
    return collectives.reduce_scatter(comm, x)


def ring_all_gather(comm, chunk, counts):
    return collectives.all_gather(comm, chunk, counts)


def ring_all_reduce(comm, x):
    return collectives.all_reduce(comm, x, algorithm="ring")


def predicted_ring_time(nbytes, p, alpha, beta):
    return costmodel.allreduce_time("ring", nbytes, p, alpha, beta, 0.0)


def hierarchical_all_reduce(comm, x, ranks_per_node):
    return collectives.hierarchical_all_reduce(*collectives.node_groups(comm, ranks_per_node), x)
