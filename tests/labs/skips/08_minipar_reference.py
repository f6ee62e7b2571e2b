"""Skips the technique by calling minipar's own redistribution (minipar.autoparallel.transitions)
from functions written in the exercise: the right pieces and the right bytes, since it is the
very code the grader's formula describes, but the learner wrote none of the messages. The trace
records who made them.

EXPECT 8.2: was made by minipar's own code, minipar/autoparallel/transitions.py:
EXPECT 8.2: called at tests/labs/skips/08_minipar_reference.py:15: write redistribute's messages yourself, with minipar.collectives
EXPECT 8.3: was made by minipar's own code, minipar/autoparallel/transitions.py:
EXPECT 8.3: write redistribute_2d's messages yourself
"""
from minipar.autoparallel import transitions


def redistribute(comm, x, src, dst, shape):
    return transitions.redistribute(comm, x, (src,), (dst,), shape)


def redistribute_2d(mesh, x, src, dst, shape):
    return transitions.redistribute(mesh, x, src, dst, shape)
