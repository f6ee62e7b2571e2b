"""Planted bug: every TP rank reads all the weights

Right at t = 1; with t ranks each holds and reads only its 1/t of every matrix, which is what
makes the step t times shorter. This one never gets faster with TP.

EXPECT_TASK: 7.5
EXPECT_MESSAGE: the same GPT at TP = 2: decode_time(weight_bytes=8.05e+08, layers=8, hidden=1024, t=2
EXPECT_MESSAGE: you computed every rank reading all the weights
"""
from minipar.labs.lab07_solution import *  # noqa: F401,F403  everything else is right


def decode_time(weight_bytes, layers, hidden, t, batch, bandwidth, peak_flops, alpha, beta, dtype_bytes=2):
    read = weight_bytes / bandwidth  # BUG: the whole model, not this rank's 1/t
    compute = 2 * batch * (weight_bytes / dtype_bytes) / t / peak_flops
    ring = 2 * (t - 1) * alpha + 2 * (t - 1) / t * batch * hidden * dtype_bytes * beta
    return max(read, compute) + 2 * layers * ring
