"""Planted bug: the merge adds the two blocks' sums as they are

acc_a and l_a are sums of exp(s - m_a), acc_b and l_b of exp(s - m_b): relative to different
maxima. Added without rescaling to the common max, the block with the smaller max counts
exp(m_b - m_a) times too much.

EXPECT_TASK: 6.1
EXPECT_MESSAGE: merge(a, b), case 'two blocks of 3 and 4 keys': acc and l were added without rescaling
"""
from minipar.labs.lab06_solution import *  # noqa: F401,F403  everything else is right
from minipar.xp import namespace


def merge(a, b):
    (acc_a, m_a, l_a), (acc_b, m_b, l_b) = a, b
    return acc_a + acc_b, namespace(m_a).maximum(m_a, m_b), l_a + l_b  # BUG: no exp(m_a - m), exp(m_b - m)
