"""Planted bug: the hierarchical all-reduce pairs the wrong ranks across nodes

The ranks are pictured as a snake around the nodes: on every odd node the local ranks are
counted backwards, so local rank l of node 0 is paired with local rank R-1-l of node 1. Those
two hold different shards after the intra-node reduce-scatter, and adding them mixes shards.
The smallest failing case is 2 nodes of 2 ranks: rank 0 sends to rank 3.

EXPECT_TASK: 1.7
EXPECT_MESSAGE: rank 0 (local rank 0 of node 0) sent 24 bytes to rank 3, local rank 1 of node 1 (n=12, 2 nodes x 2 ranks)
EXPECT_MESSAGE: across nodes, to its own local rank on the next node (rank 2)
"""
from minipar.labs.lab01_solution import *  # noqa: F401,F403  everything else is right
from minipar.xp import chunk_bounds, copy, empty


def ring(comm, buf, bounds, phase):
    """One ring phase on comm, in place on buf (chunks ``bounds``): written with sendrecv, as 1.3 and 1.4."""
    p, r = comm.size, comm.rank
    for s in range(p - 1):
        i, j = ((r - s - 1) % p, (r - s - 2) % p) if phase == "reduce-scatter" else ((r - s) % p, (r - s - 1) % p)
        (sa, sb), (ra, rb) = bounds[i], bounds[j]
        got = empty((rb - ra,), like=buf)
        comm.sendrecv(copy(buf[sa:sb]), (r + 1) % p, got, (r - 1) % p)
        if phase == "reduce-scatter":
            buf[ra:rb] += got
        else:
            buf[ra:rb] = got


def hierarchical_all_reduce(comm, x, ranks_per_node):
    R = ranks_per_node
    local, on = comm.rank % R, comm.rank // R
    node = comm.split(on, key=comm.rank)
    peers = comm.split(local if on % 2 == 0 else R - 1 - local, key=comm.rank)  # BUG: the snake's pairing
    buf, b = copy(x), chunk_bounds(len(x), R)
    ring(node, buf, b, "reduce-scatter")
    a, c = b[node.rank]
    shard = buf[a:c]  # a view: the rings below write into buf
    ring(peers, shard, chunk_bounds(len(shard), peers.size), "reduce-scatter")
    ring(peers, shard, chunk_bounds(len(shard), peers.size), "all-gather")
    ring(node, buf, b, "all-gather")
    return buf
