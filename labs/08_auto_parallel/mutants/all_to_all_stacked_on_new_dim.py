"""Planted bug: the all-to-all stacks what arrives along the new split dim instead of the old one

S(0) -> S(1): every rank cuts its rows into m column chunks and sends chunk j to rank j. What
arrives from rank j is rank j's rows of my columns, so the pieces stack along dim 0 (the dim
that was split and now is whole). Stacked along dim 1 instead, the result has the shape of the
old piece, not of the new one.

EXPECT_TASK: 8.2
EXPECT_MESSAGE: rank 0: my piece has shape (2, 3, 3), expected (6, 1, 3) (S(0) -> S(1), shape (6, 3, 3) on mesh 3)
"""
from minipar.autoparallel.placement import Shard
from minipar.collectives import all_to_all_v
from minipar.labs.lab08_solution import *  # noqa: F401,F403  everything else is right
from minipar.labs.lab08_solution import redistribute as _right
from minipar.xp import chunk_bounds, namespace


def redistribute(comm, x, src, dst, shape):
    if not (isinstance(src, Shard) and isinstance(dst, Shard) and src != dst):
        return _right(comm, x, src, dst, shape)
    d, e, m, xp = src.dim, dst.dim, comm.size, namespace(x)
    cuts = chunk_bounds(x.shape[e], m)
    pieces = [xp.reshape(x[(slice(None),) * e + (slice(a, b),)], (-1,)) for a, b in cuts]  # flat
    rows, counts = all_to_all_v(comm, xp.concat(pieces), [p.shape[0] for p in pieces])
    starts = [sum(counts[:j]) for j in range(m + 1)]
    d_sizes = [b - a for a, b in chunk_bounds(shape[d], m)]
    got = []
    for j in range(m):
        piece = list(x.shape)
        piece[d], piece[e] = d_sizes[j], cuts[comm.rank][1] - cuts[comm.rank][0]
        got.append(xp.reshape(rows[starts[j]:starts[j + 1]], tuple(piece)))
    return xp.concat(got, axis=e)  # BUG: the pieces are rank j's rows: they stack along d
