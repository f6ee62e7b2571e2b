"""Lab 05: 3D parallelism, the pieces that glue DP, PP and TP into one training step.

Fill in each function below, then run it on real ranks and grade it:

    mpiexec -n 8 python -m mpi4py minipar-labs/05_3d/exercise.py     # see what your code does (1, 2, 4 or 8 ranks)
    torchrun --standalone --nproc-per-node 8 minipar-labs/05_3d/exercise.py   # the same, torch
    minipar check 05                                         # grade every task
    minipar check 05 --task 5.2                              # grade one task
    minipar check 05 --backend torch                         # grade it on torch tensors

Communicate with minipar.collectives (all_reduce: a ring on send/recv, traced, so the grader
can count what you sent) or comm's own send/recv/sendrecv. comm.builtin is off limits.
Arrays are float64 unless a docstring says otherwise.

One code, two backends: the arrays are NumPy arrays under MPI and torch tensors under
torch.distributed. Compute with the array namespace of your inputs, xp = namespace(x) (NumPy's
or torch's functions by the array-API names: xp.exp, xp.max(z, axis=-1), xp.stack, ...), and
allocate with minipar.xp: empty(shape, like=x), zeros(shape, like=x), both of x's kind, dtype
and device.

The grader checks the technique, not only the values: in 5.2 the other ranks' logits are NaN on
your rank and only 3N numbers may travel (never the logits); in 5.3 only the two ends of the
pipeline may talk; in 5.4 the bytes you send over the dp group must be one step's average, not
one per micro-batch; in 5.5 each rank's piece of a dropout mask must be a slice of the mask one
process draws; in 5.6 you are handed only your own shards (the other dp ranks' elements are NaN)
and the norm must be one process's to 1e-12.
"""
import math  # noqa: F401

import numpy as np  # noqa: F401

import minipar
from minipar.collectives import all_reduce  # noqa: F401  all_reduce(comm, x, op="sum" | "max")
from minipar.xp import chunk_bounds  # noqa: F401  chunk_bounds(n, p)[r]: rank r's [lo, hi) of n
from minipar.xp import device, empty, namespace, zeros  # noqa: F401  of x's kind (NumPy or torch), dtype, device


def grid_groups(dp, pp, tp, rank):
    """The world ranks that form each of ``rank``'s groups on a dp x pp x tp grid.

    World rank w sits at numpy.arange(dp * pp * tp).reshape(dp, pp, tp)[d, p, t] == w: TP
    partners are neighbours. Return a dict:
      "tp": the ranks with the same (d, p)   (they split every layer's matrices)
      "pp": the ranks with the same (d, t)   (the stages of one pipeline)
      "dp": the ranks with the same (p, t)   (replicas of the same shard: average gradients here)
      "emb": [first stage's rank, last stage's rank] of the same (d, t) when ``rank`` is the first
             or the last stage and pp > 1 (they hold the two copies of the tied embedding); else None
    Each list ordered by the coordinate along its axis (= the rank inside the group).
    """
    # TODO(lab5.1): find rank's (d, p, t); slice the arange along each axis
    raise NotImplementedError("lab 5.1")


def vocab_parallel_cross_entropy(comm, logits, labels):
    """Cross-entropy over a vocabulary split across comm: no rank ever holds the whole logits.

    logits: (B, T, V); your rank owns the columns lo:hi = chunk_bounds(V, p)[rank] (V divides by
    p); the others' columns are NaN on your rank. labels: (B, T) ints in [0, V).
    Return (loss, dlogits): loss = the mean over the N = B*T tokens of -log softmax(z)[label];
    dlogits = (softmax(z) - onehot(label)) / N for your columns only, shape (B, T, hi - lo).

    softmax needs exp(z - m) with m a shift that keeps exp from overflowing (above ~709 in
    float64): the row's max, and the *same* m on every rank, or the partial sums are in
    different units. So: all-reduce the maxima first (op="max"); then one all-reduce of your
    partial [sum of exps, label logit] (the label's logit lives on one rank, the others add 0).
    """
    # TODO(lab5.2): slice your columns; all_reduce the row maxima (max); all_reduce the partial
    #               sums; loss and your columns of dlogits
    raise NotImplementedError("lab 5.2")


def sync_tied(pp, grad):
    """Sum the tied embedding's gradient over the first and the last pipeline stage.

    pp: the pipeline group (rank k = stage k). The token embedding (stage 0) and the LM head
    (stage pp.size - 1) use the same weight, so each of the two stages holds a copy and the
    gradient of its own use. grad: that gradient on the two ends, None on the stages in between.
    Return the sum of both on the two ends (bitwise equal on both), None in between. With one
    stage there is one copy, whose gradient already holds both uses: return it unchanged.
    """
    # TODO(lab5.3): the two ends exchange their gradients (pp.sendrecv, or an all_reduce over a
    #               group of the two made with pp.split) and add; the middle stages do nothing
    raise NotImplementedError("lab 5.3")


def train_step(grid, pipeline, grads, tied):
    """The gradients of one training step on a dp x pp x tp grid (the optimizer step follows).

    grid: grid.dp, grid.pp, grid.tp (communicators), grid.emb (the first and last stage, or None),
    grid.coords = (d, p, t). pipeline(after_action=None): runs every micro-batch's forward and
    backward through the pipeline (lesson 03's executor over grid.pp; TP inside the layers); the
    gradients accumulate into ``grads``; returns this replica's loss on the last stage, else None.
    grads: this rank's gradient arrays (still holding the previous step's values): write into them.
    tied: the tied embedding's gradient (one of grads) on the first and last stage, else None.
    Afterwards every gradient must be the gradient of the global batch's mean loss, the same on
    every replica. Nothing to return (the loss is what pipeline() returns).
    """
    # TODO(lab5.4): zero the gradients, run the pipeline once, sum the tied gradient (5.3), then
    #               average every gradient over grid.dp: once per step, after the flush
    raise NotImplementedError("lab 5.4")


def dropout_mask(comm, key, rows, positions, cols, shape, p):
    """Which elements of a dropout site this rank keeps, the same on every grid.

    The site's activation is (global batch, T, D) = (..., *shape) in one process. Your rank holds
    the global batch rows ``rows`` (a DP replica's micro-batch), the positions ``positions`` (all,
    or a context-parallel rank's zigzag chunks) and the columns lo:hi = ``cols`` (all, or a TP
    rank's shard). key: ints (seed, step, layer, site). Return the keep mask of those elements,
    bools of shape (len(rows), len(positions), hi - lo), each kept with probability 1 - p.

    Every element's mask must be a function of the key and its *global* index (row, position,
    column) only: then every grid draws the masks one process draws, and trains its losses. Not
    of the rank (comm is handed to you; you should not need it: nothing has to travel).
    """
    # TODO(lab5.5): a counter-based generator (np.random.Philox: key from the key, counter from
    #               the global row); draw each of your rows whole and keep your positions and columns
    raise NotImplementedError("lab 5.5")


def global_grad_norm(grid, grads):
    """The global L2 norm of the model's gradient (what --clip clips by), the same on every rank.

    grid: minipar's Grid (grid.world, grid.dp, grid.pp, grid.tp, grid.coords = (d, p, t)).
    grads: this rank's pieces, a list of (name, g, split, (lo, hi)):
      g      flat float64, this rank's TP piece of the parameter's gradient (split over grid.tp when
             ``split``, else whole on every TP rank: LayerNorms, row-parallel biases, wpe);
      lo:hi  this rank's ZeRO shard over grid.dp: g[lo:hi] is yours, the rest of g is NaN (the
             other dp ranks hold it).
    The tied embedding 'wte' is listed on the first stage and again on the last (one parameter,
    its gradient already summed by 5.3).

    Return sqrt(sum of the squares of every element of the model, each counted exactly once), as
    one process computes it.
    """
    # TODO(lab5.6): add the squares of what this rank answers for; one all_reduce over grid.world
    raise NotImplementedError("lab 5.6")


if __name__ == "__main__":
    from minipar.labs.lab05 import demo

    comm = minipar.init("auto")  # NumPy over MPI under mpiexec, torch tensors under torchrun
    demo(comm, grid_groups, vocab_parallel_cross_entropy, sync_tied, train_step, dropout_mask, global_grad_norm)
