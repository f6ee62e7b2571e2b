"""Lab 01: collectives from send/recv.

Fill in each function below, then run it on real ranks and grade it:

    mpiexec -n 4 python -m mpi4py minipar-labs/01_collectives/exercise.py     # see what your code does
    torchrun --standalone --nproc-per-node 4 minipar-labs/01_collectives/exercise.py   # the same, torch
    minipar check 01                                                  # grade every task
    minipar check 01 --task 1.3                                       # grade one task
    minipar check 01 --backend torch                                  # grade it on torch tensors

Use only comm.send / comm.recv / comm.sendrecv (and isend/irecv): comm.builtin is off limits.
`comm.send` is synchronous: it returns only once the receiver has started receiving.

One code, two backends: x is a NumPy array under MPI and a torch tensor under torch.distributed.
Allocate and copy through minipar.xp, which follows its argument's kind, dtype and device:
empty(shape, like=x) is a new buffer, copy(x) a copy (docs/communicator.md).

The grader checks the technique, not only the values: it refuses comm.builtin, counts the
bytes and messages each rank sends (exactly what the ring sends, to the right neighbour),
checks that the broadcast is a tree (every rank within ceil(log2 p) hops of the root), and
for the hierarchical all-reduce counts the bytes inside and between (emulated) nodes.
"""
import minipar
from minipar.xp import chunk_bounds  # chunk_bounds(n, p)[r] = (start, stop) of rank r's chunk
from minipar.xp import copy, empty  # copy(x); empty(shape, like=x): x's kind (NumPy or torch), dtype, device


def ring_pass(comm, x):
    """Send x to the right neighbour (rank + 1) and return what arrives from the left (rank - 1).

    The ranks form a ring: rank p-1's right neighbour is rank 0. Must not deadlock for any p,
    including p = 1 (where you pass to yourself).
    """
    # TODO(lab1.1): one exchange around the ring (hint: comm.sendrecv into empty(x.shape, like=x))
    raise NotImplementedError("lab 1.1")


def tree_broadcast(comm, x, root=0):
    """Binomial-tree broadcast: on `root` x holds the data, elsewhere x is a buffer to fill.

    Before: only the root's x holds the data. After: every rank's x holds it, and x is returned.
    Each rank receives the data exactly once, every rank is at most ceil(log2 p) hops from the
    root, and the root sends at most ceil(log2 p) messages: the ranks that hold the data double
    every round.
    """
    # TODO(lab1.2): receive once from your parent, then send to your children
    raise NotImplementedError("lab 1.2")


def ring_reduce_scatter(comm, x):
    """Return this rank's chunk of the elementwise sum of every rank's x.

    Chunks follow chunk_bounds(len(x), p): rank r owns chunk r. Lengths that do not divide by p,
    and lengths shorter than p, must work. The caller's x is not modified. Each rank sends only to
    its right neighbour, p-1 messages of one chunk each: (p-1)/p of x in all, never a whole x.
    """
    # TODO(lab1.3): p-1 sendrecv steps on a copy of x, then return your own chunk
    raise NotImplementedError("lab 1.3")


def ring_all_gather(comm, chunk, counts):
    """Every rank holds one chunk (rank r's has counts[r] elements); return their concatenation.

    Before: rank r holds chunk r. After: every rank holds all p chunks, in rank order. Each rank
    sends only to its right neighbour, p-1 messages of one chunk each (every chunk but one).
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
    comm = minipar.init("auto")  # NumPy over MPI under mpiexec, torch tensors under torchrun
    x = comm.asarray([10.0 * comm.rank + i for i in range(6)])
    for name, call in [("ring_pass", lambda: ring_pass(comm, x)),
                       ("tree_broadcast", lambda: tree_broadcast(comm, copy(x), 0)),
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
