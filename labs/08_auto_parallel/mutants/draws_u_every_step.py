"""Planted bug: u = rng.random() drawn for every candidate, also for one that is not slower

Metropolis needs u only to decide a slower candidate: one that is not slower is taken without
a draw. The decisions come out right, but the chain's random draws are one stream: the extra
draw shifts every later proposal, so the chain is no longer FlexFlow's for the same seed.

EXPECT_TASK: 8.5
EXPECT_MESSAGE: mcmc_step drew u = rng.random() 1 time for a move 10% faster (beta 30, cost 0.002 s)
EXPECT_MESSAGE: a candidate that is not slower is taken without a draw; draw u only for a slower candidate, once
"""
import math

from minipar.autoparallel.search import movable, propose
from minipar.labs.lab08_solution import *  # noqa: F401,F403  everything else is right


def mcmc_step(strategy, cost, space, simulate, rng, beta=30.0):
    candidate = propose(strategy, space, movable(space), rng)
    c = simulate(candidate)
    u = rng.random()  # BUG: drawn before knowing whether the candidate is slower
    if c <= cost or u < math.exp(-beta * (c - cost) / cost):
        return candidate, c, True
    return strategy, cost, False
