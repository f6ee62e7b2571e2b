"""Planted bug: ZeRO-3 that gathers every layer up front and keeps them

The output is right, but every layer's full weights are alive at once: the memory of plain
data parallelism, with ZeRO-3's extra traffic on top.

EXPECT_TASK: 4.5
EXPECT_MESSAGE: rank 0: the gathered weights of layer 0 are still alive when layer 1 runs
"""
import math

from minipar.collectives import all_gather
from minipar.labs.lab04_solution import *  # noqa: F401,F403  everything else is right


def zero3_forward(comm, shards, shapes, x, layer):
    full = [all_gather(comm, s)[:math.prod(shape)].reshape(shape) for s, shape in zip(shards, shapes)]  # BUG
    y = x
    for i, w in enumerate(full):
        y = layer(i, w, y)
    return y
