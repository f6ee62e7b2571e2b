"""Lab 05, task 5.5: dropout that does not depend on the grid (the rest of the lab's checks:
``minipar.labs.lab05``).

Every rank draws the keep mask of the elements it holds (global batch rows, positions, columns of
a (B, T, D) site); the pieces of every split (columns over tp, rows over dp, zigzag positions over
cp, two at once) must be the slices of the mask the same function draws for everything in one
process, and that mask must be the same on every rank (a seed taken from the rank fails here).
Nothing may travel. The typical mistake of Megatron's RNG tracker with one seed inside a TP
region, drawing by the local index, is named.
"""
from __future__ import annotations

import numpy as np

from ..xp import chunk_bounds, to_numpy
from .checks import expect_traffic, graded, no_builtin, stop

# Task 5.5's hints, stage by stage (`minipar check 05 --hint 5.5`; lab05.HINTS holds every task's).
DROPOUT_HINTS = {
    "5.5": (
        """A mask that is a function of (key, the element's global index) and of nothing else: no rank,
        no order of draws. A counter-based generator does it: NumPy's Philox takes a key and a
        counter and starts its stream there, so the stream of global row r can start at counter r
        without drawing rows 0 ... r-1. The lesson: minipar/nn/dropout.py, docs/train.md.""",
        """key -> Philox's 128-bit key: np.random.SeedSequence(list(key)).generate_state(2, np.uint64).
        For each global row r of rows: u = Generator(Philox(key=k, counter=[0, r, 0, 0])).random((T, D)),
        the whole row; keep u[positions, lo:hi] >= p. Stack the rows.""",
        """
        k = np.random.SeedSequence(list(key)).generate_state(2, np.uint64)
        lo, hi = cols
        u = [np.random.Generator(np.random.Philox(key=k, counter=[0, int(r), 0, 0])).random(shape) for r in rows]
        return np.stack([row[np.asarray(positions)][:, lo:hi] >= p for row in u])
        """,
    ),
}


DB, DT, DD = 8, 8, 24  # a site's global (batch, positions, columns): divisible by 2 and 4, zigzag over 2 and 4
KEYS = [(0, 3, 1, 2), (7, 0, 5, 1)]  # (seed, step, layer, site)


def dropout_splits(p, r):
    """{split: (rows, positions, cols)} that rank r of p holds, split the ways a grid splits a site."""
    from ..context_parallel import SeqLayout

    every = (np.arange(DB), np.arange(DT), (0, DD))
    cols = chunk_bounds(DD, p)[r]
    rows = np.arange(*chunk_bounds(DB, p)[r])
    out = {f"columns over tp = {p}": (every[0], every[1], cols),
           f"rows over dp = {p} (its micro-batch of rows {rows[0]}..{rows[-1]})": (rows, every[1], every[2]),
           f"zigzag positions over cp = {p}": (every[0], SeqLayout(DT, p).positions(r), every[2])}
    if p == 4:  # dp 2 x tp 2: rank r = 2 d + t
        d, t = divmod(r, 2)
        out["rows over dp = 2 and columns over tp = 2"] = (np.arange(*chunk_bounds(DB, 2)[d]), every[1],
                                                          chunk_bounds(DD, 2)[t])
    return out


def _mask(comm, fn, key, rows, positions, cols, p):
    """The learner's mask as a bool array of the expected shape, or (None, failure)."""
    g = graded(comm, lambda: fn(comm, key, rows.copy(), np.array(positions), cols, (DT, DD), p))
    fails = no_builtin(comm, g, "dropout_mask", "nothing: no message is needed")
    fails = fails or expect_traffic(comm, g, "drawing the mask of the elements this rank holds", 0,
                                    hint="each rank can draw its own elements: nothing needs to travel")
    want = (len(rows), len(positions), cols[1] - cols[0])
    got = None if g.out is None else to_numpy(g.out)
    if not fails and (got is None or tuple(got.shape) != want):
        fails = [f"rank {comm.rank}: dropout_mask returned {None if got is None else tuple(got.shape)}, expected a "
                 f"keep mask of shape {want} (rows, positions, columns held)"]
    return (None, fails) if fails else (got.astype(bool), [])


def check_dropout(comm, fn):
    r = comm.rank
    for key in KEYS:
        for prob in (0.25, 0.5):
            case = f"key (seed, step, layer, site) = {key}, p = {prob}, a site of global shape ({DB}, {DT}, {DD})"
            full, fails = _mask(comm, fn, key, np.arange(DB), np.arange(DT), (0, DD), prob)
            if not fails:
                rank0 = comm.builtin.bcast_object(full, 0)
                if not np.array_equal(full, rank0):
                    fails = [f"rank {r} drew another mask than rank 0 for the same elements ({case}): the mask must be a "
                             f"function of the key and the element's global index, not of the rank drawing it (a seed "
                             f"taken from the rank gives every grid other masks, and other losses)"]
            if not fails and abs(full.mean() - (1 - prob)) > 0.06:
                fails = [f"rank {r}: the mask keeps {full.mean():.3f} of the elements, expected about 1 - p = "
                         f"{1 - prob} ({case})"]
            if not fails:
                other, fails = _mask(comm, fn, (key[0], key[1] + 1) + key[2:], np.arange(DB), np.arange(DT), (0, DD), prob)
                if not fails and np.array_equal(other, full):
                    fails = [f"rank {r}: the next step draws the same mask ({case}): the key (seed, step, layer, site) "
                             f"must enter the draw"]
            if stop(comm, fails):  # every rank's one-process mask first: a rank's seed shows here
                return fails
            for split, (rows, positions, cols) in dropout_splits(comm.size, r).items():
                piece, fails = _mask(comm, fn, key, rows, positions, cols, prob)
                if fails:
                    break
                want = full[np.ix_(rows, positions, np.arange(*cols))]
                if not np.array_equal(piece, want):
                    lo, hi = cols
                    local = full[:len(rows), :len(positions), :hi - lo]
                    fails = [f"rank {r}: the mask of rows {rows[0]}..{rows[-1]}, positions {[int(i) for i in positions]}, columns "
                             f"{lo}:{hi} ({split}; {case}) is not those elements' mask in one process"
                             + (": it is one process's mask of the first rows, positions and columns, drawn by the "
                                "local index (every TP rank then drops the same columns of its shard, Megatron's "
                                "shared seed inside a TP region): count from the element's global index"
                                if np.array_equal(piece, local) else "")]
                    break
            if stop(comm, fails):
                return fails
    return []
