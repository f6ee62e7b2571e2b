"""Planted bug: TP's all-reduce carries the weights

Right at t = 1 (no all-reduce); with t > 1 each layer's two all-reduces sum a (batch x hidden)
activation, a few KB. Sending the weights instead would make TP slower than one device.

EXPECT_TASK: 7.5
EXPECT_MESSAGE: the same GPT at TP = 2
EXPECT_MESSAGE: you computed an all-reduce of the whole weight
"""
from minipar.labs.lab07_solution import *  # noqa: F401,F403  everything else is right


def decode_time(weight_bytes, layers, hidden, t, batch, bandwidth, peak_flops, alpha, beta, dtype_bytes=2):
    read = weight_bytes / t / bandwidth
    compute = 2 * batch * (weight_bytes / dtype_bytes) / t / peak_flops
    n = weight_bytes  # BUG: the weights, not the (batch x hidden) activation
    ring = 2 * (t - 1) * alpha + 2 * (t - 1) / t * n * beta
    return max(read, compute) + 2 * layers * ring
