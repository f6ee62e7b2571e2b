"""Planted bug: the merge rescales with exp(m_a - m) even where m = -inf

A query row that saw no key in either block has m_a = m_b = -inf, so m = -inf and
exp(m_a - m) = exp(-inf + inf) = exp(nan): the row becomes NaN instead of "nothing seen".
Such rows occur with causal masks (a block entirely in a query's future) and padding.

EXPECT_TASK: 6.1
EXPECT_MESSAGE: case 'query 0 sees no key in either block': NaN for a query row that saw no key in either block
"""
from minipar.labs.lab06_solution import *  # noqa: F401,F403  everything else is right
from minipar.xp import namespace


def merge(a, b):
    (acc_a, m_a, l_a), (acc_b, m_b, l_b) = a, b
    xp = namespace(acc_a)
    m = xp.maximum(m_a, m_b)
    ca, cb = xp.exp(m_a - m), xp.exp(m_b - m)  # BUG: -inf - (-inf) is NaN
    return acc_a * ca + acc_b * cb, m, l_a * ca + l_b * cb
