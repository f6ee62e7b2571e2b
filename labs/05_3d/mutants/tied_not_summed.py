"""Planted bug: the tied embedding's gradient is not summed across the first and last stage

Each end keeps the gradient of its own use only: the embedding's copy steps with the
embedding's gradient, the head's with the head's, and the two copies of one weight drift apart.

EXPECT_TASK: 5.3
EXPECT_MESSAGE: rank 0 returned its own stage's gradient only (shape (12, 8), pipeline of 2 stages)
"""
from minipar.labs.lab05_solution import *  # noqa: F401,F403  everything else is right


def sync_tied(pp, grad):
    return grad  # BUG: no sum over the two ends
