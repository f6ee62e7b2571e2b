"""Skips the technique with minipar's own engines (minipar.torch): its DistributedDataParallel's
reducer for the hooks, and its tensor-parallel f and g. The right values and the right messages,
but written by minipar, not by the learner: each is refused in one line naming the call.

EXPECT 9.1: GradientBuckets ran minipar's own engine, minipar.torch.
EXPECT 9.1: (called at tests/labs/skips/09_minipar_torch.py:
EXPECT 9.3: tp_mlp ran minipar's own engine, minipar.torch.tp.
"""
import torch

from minipar.torch import tp
from minipar.torch.ddp import GradientReducer
from minipar.torch.group import unique_params


class GradientBuckets:
    def __init__(self, comm, module, bucket_bytes):
        self.reducer = GradientReducer(comm, unique_params(module), bucket_bytes)

    def finish(self):
        self.reducer.finish()


def tp_mlp(comm, x, w1, b1, w2, b2):
    h = torch.nn.functional.gelu(tp.f(comm, x) @ w1.T + b1)
    return tp.g(comm, h @ w2.T) + b2
