"""Planted bug: the capacity is computed from all ranks' tokens instead of this rank's

capacity = ceil(factor * k * N / E) is what an expert accepts from ONE group of N tokens: each
rank decides its own drops, without asking the others. Using p * N (the tokens of every
rank) lets each rank keep p times too many.

EXPECT_TASK: 6.4
EXPECT_MESSAGE: rank 0: keep matches a capacity of ceil(1.0 * 1 * 24 / 4) = 6, computed over all 2 ranks' tokens
EXPECT_MESSAGE: capacity is per rank: every rank decides its own drops from its own 12 tokens
"""
from minipar.experts.routing import capacity, route as route_tokens
from minipar.labs.lab06_solution import *  # noqa: F401,F403  everything else is right
from minipar.xp import to_numpy


def route(comm, probs, k, capacity_factor):
    N, E = probs.shape
    r = route_tokens(to_numpy(probs), k, capacity(N * comm.size, E, k, capacity_factor))  # BUG: every rank's tokens
    return r.choice, r.keep
