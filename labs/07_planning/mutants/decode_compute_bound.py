"""Planted bug: a decode step timed by its FLOPs, as if it were compute-bound

2 FLOPs per weight at batch 1 is far below the ridge point (peak / bandwidth FLOPs per byte):
reading the weights takes longer than multiplying by them, so this is several times too fast.

EXPECT_TASK: 7.5
EXPECT_MESSAGE: lesson 05's GPT, d = 1024, one rank of this machine: decode_time(weight_bytes=8.05e+08
EXPECT_MESSAGE: you computed compute-bound arithmetic
"""
from minipar.labs.lab07_solution import *  # noqa: F401,F403  everything else is right


def decode_time(weight_bytes, layers, hidden, t, batch, bandwidth, peak_flops, alpha, beta, dtype_bytes=2):
    compute = 2 * batch * (weight_bytes / dtype_bytes) / t / peak_flops  # BUG: no memory term
    ring = 2 * (t - 1) * alpha + 2 * (t - 1) / t * batch * hidden * dtype_bytes * beta
    return compute + 2 * layers * ring
