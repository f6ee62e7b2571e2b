"""Lab 01: collectives from send/recv.

Fill in each function below, then run it on real ranks and grade it:

    mpiexec -n 4 python -m mpi4py minipar-labs/01_collectives/exercise.py     # see what your code does
    minipar check 01                                                  # grade every task
    minipar check 01 --task 1.3                                       # grade one task

Use only comm.send / comm.recv / comm.sendrecv (and isend/irecv): comm.builtin is off limits.
`comm.send` is synchronous: it returns only once the receiver has started receiving.

The grader checks the technique, not only the values: it refuses comm.builtin, counts the
bytes and messages each rank sends (exactly what the ring sends, to the right neighbour),
checks that the broadcast is a tree (every rank within ceil(log2 p) hops of the root), and
for the hierarchical all-reduce counts the bytes inside and between (emulated) nodes.
"""
import numpy as np

import minipar
from minipar.xp import chunk_bounds  # chunk_bounds(n, p)[r] = (start, stop) of rank r's chunk


def ring_pass(comm, x):
    """Send x to the right neighbour (rank + 1) and return what arrives from the left (rank - 1).

    The ranks form a ring: rank p-1's right neighbour is rank 0. Must not deadlock for any p,
    including p = 1 (where you pass to yourself).
    """
    # TODO(lab1.1): one exchange around the ring (hint: comm.sendrecv, buffer = np.empty_like(x))
    raise NotImplementedError("lab 1.1")


def tree_broadcast(comm, x, root=0):
    """Binomial-tree broadcast: on `root` x holds the data, elsewhere x is a buffer to fill.

    Count ranks relative to the root (vr = (rank - root) % p). In round k = 0, 1, ... every rank
    vr < 2^k that has the data sends it to vr + 2^k (if that rank exists). Return x.
    The root may send at most ceil(log2 p) messages.
    """
    # TODO(lab1.2): receive once from your parent, then send to your children
    raise NotImplementedError("lab 1.2")


def ring_reduce_scatter(comm, x):
    """Return this rank's chunk of the elementwise sum of every rank's x.

    Chunks follow chunk_bounds(len(x), p): rank r owns chunk r. Lengths that do not divide by p,
    and lengths shorter than p, must work. In step s = 0 .. p-2 send chunk (r - s - 1) % p to the
    right and add the chunk (r - s - 2) % p arriving from the left into your copy of x.
    """
    # TODO(lab1.3): p-1 sendrecv steps on a copy of x, then return your own chunk
    raise NotImplementedError("lab 1.3")


def ring_all_gather(comm, chunk, counts):
    """Every rank holds one chunk (rank r's has counts[r] elements); return their concatenation.

    In step s = 0 .. p-2 pass chunk (r - s) % p to the right and receive chunk (r - s - 1) % p
    from the left, straight into its place in the output.
    """
    # TODO(lab1.4): allocate the output, place your chunk, then p-1 sendrecv steps
    raise NotImplementedError("lab 1.4")


def ring_all_reduce(comm, x):
    """The elementwise sum of every rank's x, on every rank: reduce-scatter, then all-gather.

    Each rank must send no more than 2(p-1) chunks: that is what makes the ring
    bandwidth-optimal.
    """
    # TODO(lab1.5): combine your ring_reduce_scatter and ring_all_gather
    raise NotImplementedError("lab 1.5")


def predicted_ring_time(nbytes, p, alpha, beta):
    """Seconds the alpha-beta model predicts for a ring all-reduce of nbytes on p ranks.

    Count the messages each rank sends (latency alpha each) and the bytes (beta per byte).
    Ignore the time to add numbers (gamma = 0).
    """
    # TODO(lab1.6): write the formula
    raise NotImplementedError("lab 1.6")


def hierarchical_all_reduce(comm, x, ranks_per_node):
    """ring_all_reduce over two link levels: the ranks sit on nodes of R = ranks_per_node in blocks
    (rank r on node r // R, with local rank r % R); links inside a node are fast, between nodes slow.

    1. reduce-scatter inside the node: local rank l ends with the node's sum of shard l
       (shards: chunk_bounds(len(x), R));
    2. all-reduce of that shard, and only that, among the ranks with local rank l (one per node);
    3. all-gather inside the node.
    Only the shard crosses between nodes: 2(N-1)/N of n/R per rank, where a flat ring sends
    2(p-1)/p of n. comm.split(color, key=comm.rank) makes the two communicators.
    """
    # TODO(lab1.7): split comm twice, then your 1.3, 1.5 and 1.4 on the right communicators
    raise NotImplementedError("lab 1.7")


if __name__ == "__main__":
    comm = minipar.init("mpi")
    x = np.arange(6, dtype=np.float64) + 10 * comm.rank
    for name, call in [("ring_pass", lambda: ring_pass(comm, x)),
                       ("tree_broadcast", lambda: tree_broadcast(comm, x.copy(), 0)),
                       ("ring_reduce_scatter", lambda: ring_reduce_scatter(comm, x)),
                       ("ring_all_reduce", lambda: ring_all_reduce(comm, x)),
                       ("hierarchical_all_reduce",  # "nodes" of 2 ranks (of 1 on an odd count)
                        lambda: hierarchical_all_reduce(comm, x, 2 if comm.size % 2 == 0 else 1))]:
        try:
            print(f"rank {comm.rank}: {name} -> {call()}", flush=True)
        except NotImplementedError as e:
            print(f"rank {comm.rank}: {name} not implemented yet ({e})", flush=True)
    if comm.rank == 0:
        print("now grade it: minipar check 01")
