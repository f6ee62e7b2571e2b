"""Planted bug: the hierarchical all-reduce sends the whole vector across the nodes, not the shard

After the intra-node reduce-scatter, local rank l holds the node's sum of shard l only; this
version all-reduces its whole buffer among the nodes' peers. The values still come out right
(the all-gather overwrites every shard but its own), but the slow link carries R times the bytes:
the point of the technique is lost. The smallest failing case is 2 nodes of 2 ranks.

EXPECT_TASK: 1.7
EXPECT_MESSAGE: rank 0 sent 96 bytes in 2 messages across nodes (n=12, 2 nodes x 2 ranks); the hierarchical all-reduce sends exactly 48 bytes in 2 messages there
EXPECT_MESSAGE: only the shard crosses the slow link, not the whole vector
"""
import numpy as np

from minipar.labs.lab01_solution import *  # noqa: F401,F403  everything else is right
from minipar.xp import chunk_bounds


def ring(comm, buf, bounds, phase):
    """One ring phase on comm, in place on buf (chunks ``bounds``): written with sendrecv, as 1.3 and 1.4."""
    p, r = comm.size, comm.rank
    for s in range(p - 1):
        i, j = ((r - s - 1) % p, (r - s - 2) % p) if phase == "reduce-scatter" else ((r - s) % p, (r - s - 1) % p)
        (sa, sb), (ra, rb) = bounds[i], bounds[j]
        got = np.empty(rb - ra, dtype=buf.dtype)
        comm.sendrecv(buf[sa:sb].copy(), (r + 1) % p, got, (r - 1) % p)
        if phase == "reduce-scatter":
            buf[ra:rb] += got
        else:
            buf[ra:rb] = got


def hierarchical_all_reduce(comm, x, ranks_per_node):
    R = ranks_per_node
    node = comm.split(comm.rank // R, key=comm.rank)
    peers = comm.split(comm.rank % R, key=comm.rank)
    buf, b = x.copy(), chunk_bounds(len(x), R)
    ring(node, buf, b, "reduce-scatter")
    whole = chunk_bounds(len(buf), peers.size)  # BUG: the whole buffer crosses, not buf[b[node.rank][0]:b[node.rank][1]]
    ring(peers, buf, whole, "reduce-scatter")
    ring(peers, buf, whole, "all-gather")
    ring(node, buf, b, "all-gather")
    return buf
