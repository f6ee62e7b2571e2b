"""Planted bug: a dropout mask drawn by the local index

Each rank draws its piece as if it started at row 0, position 0, column 0: the counter is the
index inside the rank's piece. In one process (the piece is everything) that is right; on a grid
every TP rank draws the same mask for its own columns, the bug of Megatron's RNG tracker with
one seed inside a TP region, and every DP replica the same mask for its rows.

EXPECT_TASK: 5.5
EXPECT_MESSAGE: is not those elements' mask in one process
EXPECT_MESSAGE: drawn by the local index (every TP rank then drops the same columns of its shard
"""
import numpy as np

from minipar.labs.lab05_solution import *  # noqa: F401,F403  everything else is right


def dropout_mask(comm, key, rows, positions, cols, shape, p):
    k = np.random.SeedSequence(list(key)).generate_state(2, np.uint64)
    lo, hi = cols
    out = []
    for i in range(len(rows)):  # BUG: my i-th row, not global row rows[i]
        u = np.random.Generator(np.random.Philox(key=k, counter=[0, i, 0, 0])).random(shape)
        out.append(u[:len(positions), :hi - lo] >= p)  # BUG: my first positions and columns
    return np.stack(out)
