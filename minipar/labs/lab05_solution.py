"""Lab 05's reference: minipar's own 3D pieces under the names the exercise uses."""
import math

import numpy as np

from ..collectives import all_reduce
from ..grid import AXES, axis_color
from ..tensor_parallel import vocab
from ..xp import zeros


def grid_groups(dp, pp, tp, rank):
    """The groups :class:`minipar.grid.Grid` builds for ``rank``: along each axis the ranks whose
    colour (their coordinates on the two other axes) is this rank's, in coordinate order."""
    shape = (dp, pp, tp)
    ranks = np.arange(dp * pp * tp).reshape(shape)
    where = {int(w): tuple(int(i) for i in np.argwhere(ranks == w)[0]) for w in ranks.flat}
    me = where[rank]
    out = {axis: [w for w, c in where.items() if axis_color(shape, c, axis) == axis_color(shape, me, axis)]
           for axis in AXES}
    out["emb"] = [out["pp"][0], out["pp"][-1]] if pp > 1 and me[1] in (0, pp - 1) else None
    return out


def vocab_parallel_cross_entropy(comm, logits, labels):
    lo, hi = vocab.vocab_range(logits.shape[-1], comm)
    return vocab.vocab_parallel_cross_entropy(comm, logits[..., lo:hi], labels, lo)


def sync_tied(pp, grad):
    """``Trainer.sync_tied`` on a pipeline group: the ``emb`` group (as ``Grid`` builds it) is the
    first and the last stage; its all-reduce sums their two copies' gradients."""
    ends = pp.split(0 if pp.rank in (0, pp.size - 1) and pp.size > 1 else None, key=pp.rank, name="emb")
    if ends is None:
        return grad
    return all_reduce(ends, grad)


def train_step(grid, pipeline, grads, tied):
    """``Trainer.step`` with the DP engine's part written out: zero, the pipeline (every
    micro-batch), the tied sum, one average over the dp group."""
    for g in grads:
        g[...] = 0
    pipeline()
    if tied is not None:
        tied[...] = sync_tied(grid.pp, tied)
    for g in grads:
        g[...] = all_reduce(grid.dp, g) / grid.dp.size


def dropout_mask(comm, key, rows, positions, cols, shape, p):
    """``minipar.nn.dropout.keep_mask``: Philox keyed by (seed, step, layer, site), one counter
    per global row; each rank keeps its positions and columns of its rows. No message."""
    from ..nn.dropout import keep_mask

    return keep_mask(key, rows, shape, positions, cols, p)


def global_grad_norm(grid, grads):
    """The global L2 norm as ``Trainer.grad_norm`` takes it: each rank adds the squares of what it
    answers for (``Trainer.counted_here``: a TP shard on its rank, a parameter whole on every TP
    rank on TP rank 0, the tied embedding on the first stage; its ZeRO shard over dp), then one
    all-reduce over the world."""
    d, p, t = grid.coords
    mine = zeros((1,), like=grads[0][1])  # the backend's kind, float64
    for name, g, split, (lo, hi) in grads:
        tied_copy = name == "wte" and p == grid.pp.size - 1 and p > 0
        if (split or t == 0) and not tied_copy:
            mine += (g[lo:hi] ** 2).sum()
    return math.sqrt(float(all_reduce(grid.world, mine)[0]))
