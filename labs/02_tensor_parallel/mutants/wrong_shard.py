"""Planted bug: each rank takes the next rank's columns (chunk r + 1 instead of chunk r)

The shards still cover the whole weight, but rank r's Y_r is no longer columns chunk r of Y:
whoever assembles the output (or the next layer's rows) pairs it with the wrong columns.

EXPECT_TASK: 2.1
EXPECT_MESSAGE: returned the columns of rank
"""
from minipar.labs.lab02_solution import *  # noqa: F401,F403  everything else is right
from minipar.xp import chunk_bounds


def column_forward(comm, x, w, b):
    lo, hi = chunk_bounds(w.shape[1], comm.size)[(comm.rank + 1) % comm.size]  # BUG: the next rank's chunk
    return x @ w[:, lo:hi] + b[lo:hi]
