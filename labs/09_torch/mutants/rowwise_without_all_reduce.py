"""Planted bug: a rowwise layer without its all-reduce

g's forward returns this rank's partial sum as it is: each rank's output is its own hidden
features times its own columns of W2, not the whole product.

EXPECT_TASK: 9.3
EXPECT_MESSAGE: rank 0: the output is this rank's own partial sum (its hidden features times its columns of W2), not the sum over the 2 ranks
EXPECT_MESSAGE: the rowwise layer's output goes through g, whose forward is an all-reduce
"""
import torch

from minipar.collectives import all_reduce


class CopyToRanks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, comm, x):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dx):
        return None, all_reduce(ctx.comm, dx.contiguous())


class SumFromRanks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, comm, y):
        return y.view_as(y)  # BUG: the partial sums are never added over the ranks

    @staticmethod
    def backward(ctx, dy):
        return None, dy


def tp_mlp(comm, x, w1, b1, w2, b2):
    h = torch.nn.functional.gelu(CopyToRanks.apply(comm, x) @ w1.T + b1)
    return SumFromRanks.apply(comm, h @ w2.T) + b2
