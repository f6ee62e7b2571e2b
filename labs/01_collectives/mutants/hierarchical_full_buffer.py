"""Planted bug: the hierarchical all-reduce sends the whole vector across the nodes, not the shard

After the intra-node reduce-scatter, local rank l holds the node's sum of shard l only; this
version all-reduces its whole buffer among the nodes' peers. The values still come out right
(the all-gather overwrites every shard but its own), but the slow link carries R times the bytes:
the point of the technique is lost. The smallest failing case is 2 nodes of 2 ranks.

EXPECT_TASK: 1.7
EXPECT_MESSAGE: rank 0 sent 96 bytes in 2 messages across nodes (n=12, 2 nodes x 2 ranks); the hierarchical all-reduce sends exactly 48 bytes in 2 messages there
EXPECT_MESSAGE: only the shard crosses the slow link, not the whole vector
"""
from minipar.labs.lab01_solution import *  # noqa: F401,F403  everything else is right
from minipar.xp import chunk_bounds, copy, empty



def hierarchical_all_reduce(comm, x, ranks_per_node):
    """Written on the world communicator, each ring with its own peers: no split."""
    R, N = ranks_per_node, comm.size // ranks_per_node
    node, local = divmod(comm.rank, R)
    inside = [node * R + (local + 1) % R, node * R + (local - 1) % R, local, R]  # right, left, my index, size
    across = [(node + 1) % N * R + local, (node - 1) % N * R + local, node, N]
    buf = copy(x)
    shards = chunk_bounds(len(x), R)
    steps = [(inside, shards, True), (across, chunk_bounds(len(x), N), True),  # BUG: the whole buffer crosses,
             (across, chunk_bounds(len(x), N), False), (inside, shards, False)]  # not buf[shards[local]]
    for (right, left, me, size), bounds, adding in steps:
        for s in range(size - 1):
            give, take = ((me - s - 1) % size, (me - s - 2) % size) if adding else ((me - s) % size, (me - s - 1) % size)
            got = empty((bounds[take][1] - bounds[take][0],), like=x)
            comm.sendrecv(copy(buf[slice(*bounds[give])]), right, got, left)
            if adding:
                buf[slice(*bounds[take])] += got
            else:
                buf[slice(*bounds[take])] = got
    return buf
