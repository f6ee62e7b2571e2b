"""Skips grid-independent dropout: every rank seeds its own generator with its rank and draws the
shape it holds. Each rank's masks look right alone (the right shape, 1 - p kept, a new mask each
step), but they are the rank's, not the elements': another grid draws other masks.

EXPECT 5.5: rank 1 drew another mask than rank 0 for the same elements
EXPECT 5.5: not of the rank drawing it
"""
import numpy as np

from minipar.labs.lab05_solution import grid_groups, sync_tied, train_step, vocab_parallel_cross_entropy  # noqa: F401


def dropout_mask(comm, key, rows, positions, cols, shape, p):
    rng = np.random.default_rng([*key, comm.rank])  # a seed per rank
    return rng.random((len(rows), len(positions), cols[1] - cols[0])) >= p
