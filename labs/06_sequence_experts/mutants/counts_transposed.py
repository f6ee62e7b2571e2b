"""Planted bug: the dispatch takes the counts it sends for the counts it receives

counts[i, e] must be the rows rank i sends to my local expert e (a column block of the p x E
dispatch matrix, which needs an exchange); this rank's own row of it (what it sends to each
rank's experts) is something else: the matrix transposed.

EXPECT_TASK: 6.5
EXPECT_MESSAGE: rank 0: counts equals what rank 0 sends
EXPECT_MESSAGE: the counts are transposed
"""
import numpy as np

from minipar.collectives import all_to_all_v
from minipar.experts.routing import kept_order
from minipar.labs.lab06_solution import *  # noqa: F401,F403  everything else is right
from minipar.xp import namespace


def dispatch(comm, x, choice, keep, n_experts):
    p, per, k = comm.size, n_experts // comm.size, choice.shape[1]
    order = kept_order(choice, keep)
    mine = np.bincount(choice.reshape(-1)[order], minlength=n_experts).reshape(p, per)
    counts = mine  # BUG: what I send, not what I receive (no exchange)
    got, recv = all_to_all_v(comm, x[order // k], mine.sum(axis=1))
    at = np.cumsum(np.concatenate([[0], counts.reshape(-1)]))
    blocks = [got[at[i * per + e]:at[i * per + e + 1]] for e in range(per) for i in range(p)]
    return namespace(x).concat(blocks, axis=0), counts
